"""Partition tags and routing (docs/partitions.md), without Redis."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from runner.store import keys, routing
from runner.store.keys import SLOT_MARGIN, for_partitions, for_queue, home_partition, partition_tags, slot_range
from runner.store.scripts import NewJob

from conftest import size


def _job(limits: str = "", idem: str = "", type_: str = "t") -> NewJob:
    return NewJob("id", type_, 1, "{}", 3, 0, 0, idem, "-", "", limits)


def test_one_partition_is_the_layout_of_before() -> None:
    """partitions = 1: the queue's own tag, the very keys of before."""
    assert partition_tags("fast", 1) == ("fast",)
    (k,) = for_partitions("runner", "fast", 1)
    assert k.ready == for_queue("runner", "fast").ready == "runner:{fast}:ready"


@pytest.mark.parametrize("queue", ["fast", "slow", "default", "q-1"])
@pytest.mark.parametrize("n", [2, 3, 6, 8, 64])
def test_each_partition_lies_in_its_share_of_the_slots(queue: str, n: int) -> None:
    """Partition i's slot is in the i-th n-th of the slots (a searched tag away from the
    share's ends); the queue's own tag is kept by the share that holds it."""
    tags = partition_tags(queue, n)
    assert len(set(tags)) == n and tags[home_partition(queue, n)] == queue
    for i, tag in enumerate(tags):
        lo, hi = slot_range(i, n)
        slot = key_slot(tag.encode())
        assert lo <= slot < hi, (i, tag, slot)
        if tag != queue:
            assert lo + SLOT_MARGIN <= slot < hi - SLOT_MARGIN and tag.startswith(queue + ":")


def test_doubling_keeps_every_tag() -> None:
    """3 -> 6 (and 2 -> 4 -> 8) keeps the tags of before: no job changes place."""
    for queue in ("fast", "slow", "emails"):
        assert set(partition_tags(queue, 3)) <= set(partition_tags(queue, 6))
        assert set(partition_tags(queue, 2)) <= set(partition_tags(queue, 4)) <= set(partition_tags(queue, 8))


def test_routing_takes_the_first_lock_key_then_the_idempotency_key() -> None:
    """RESOURCE_KEY, then CONCURRENCY, then RATE_LIMIT (the order of the limit lines), then
    the idempotency key, which is per function type; a job with none has no route."""
    both = _job("1 r:acct-7\n4 c:t\n10/1000 q:t", idem="k1")
    assert routing.route(both) == "r:acct-7"
    assert routing.route(_job("4 c:t:7\n10/1000 q:t")) == "c:t:7"
    assert routing.route(_job(idem="k1")) == "i:t:k1"
    assert routing.route(_job(idem="k1", type_="u")) == "i:u:k1"
    assert routing.route(_job()) == ""
    assert routing.partition_of("r:acct-7", 6) == routing.partition_of("r:acct-7", 6) < 6


def test_a_batch_goes_one_call_per_partition_and_keyless_jobs_together() -> None:
    """Keyed jobs go where their key sends them; the keyless jobs of one batch go together
    to one partition, the next batch's to the next."""
    spread = routing.Spread(start=0)
    jobs = [_job(idem=f"k{i}") for i in range(50)] + [_job() for _ in range(20)]
    first = routing.split(jobs, 6, spread)
    assert sorted(i for idx in first.values() for i in idx) == list(range(70))
    for p, idx in first.items():
        for i in idx:
            if i < 50:
                assert routing.partition_of(f"i:t:k{i}", 6) == p
    loose = [p for p, idx in first.items() if 50 in idx]
    assert all(i in first[loose[0]] for i in range(50, 70))
    second = routing.split([_job()], 6, spread)
    assert list(second) == [(loose[0] + 1) % 6]
    assert routing.split(jobs, 1, spread) == {0: list(range(70))}


def test_keyless_jobs_picked_one_by_one_share_a_partition_until_a_round_trip_is_sent() -> None:
    """Jobs picked as they are submitted (Redis Cluster's per-partition round trips) all go
    to the current partition until a round trip is sent, then to the next; a partition
    passed over (unreachable, short of replicas) is skipped; the loose jobs of a batch
    sent to a chosen partition go there."""
    spread = routing.Spread(start=0)
    assert [spread.current(6) for _ in range(5)] == [0] * 5
    spread.advance()
    assert spread.current(6) == 1
    spread.avoid(2)
    spread.advance()
    assert spread.current(6) == 3
    assert routing.split([_job(), _job(idem="k1"), _job()], 6, spread, 4)[4] == [0, 2]


def test_each_new_spread_starts_at_a_partition_of_its_own() -> None:
    """A client made per job (a CLI call, a process per job) sends its first keyless job
    to a partition drawn at random, not always partition 0 (30 fresh clients put 30 of 30
    jobs on one master)."""
    firsts = {routing.Spread().current(6) for _ in range(60)}
    assert len(firsts) >= 4, firsts  # (all six, but for one chance in millions)


@settings(max_examples=int(size("MODEL_EXAMPLES", 300, 2000)), deadline=None)
@example(b"")
@example(b"{")
@example(b"{}")
@example(b"{}{a}")
@example(b"a{b}c")
@example(b"a}{b}")
@example(b"{a")
@given(st.one_of(st.binary(max_size=40), st.text(alphabet="{}ab:", max_size=12).map(str.encode)))
def test_the_store_computes_slots_as_redis_py_does(key: bytes) -> None:
    """keys.key_slot (the store's own, so that the commands that read no redis-py need
    none) gives redis-py's slot for every key, hash tags, empty and unclosed braces
    included."""
    assert keys.key_slot(key) == key_slot(key)


def test_the_slot_of_the_cluster_specs_example() -> None:
    """The cluster specification's check value: CRC16 of "123456789" is 0x31C3."""
    assert keys.key_slot(b"123456789") == 0x31C3 % keys.HASH_SLOTS
    assert keys.key_slot(b"{user1000}.following") == keys.key_slot(b"user1000")
    assert keys.key_slot(b"foo{}{bar}") != keys.key_slot(b"bar")  # an empty first tag: the whole key


@pytest.mark.parametrize("prefix", ["runner", "t0123456789", "app:prod"])
@pytest.mark.parametrize("queue", ["fast", "slow", "default", "q-1"])
def test_the_test_clock_lives_in_its_queue_s_home_slot(prefix: str, queue: str) -> None:
    """The schedules' test clock offset of a queue is under the queue's own tag, in the
    slot of its home partition and its schedules' states: on Redis Cluster it is on the
    master that ticks its schedules, not on any other."""
    (home,) = for_partitions(prefix, queue, 1)
    assert key_slot(keys.clock_offset(prefix, queue).encode()) == key_slot(home.schedules.encode())
