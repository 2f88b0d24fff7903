"""The runtime: configuration, one Redis client, its scripts and the current registry.

Every entry point (CLI, web app, worker, dev supervisor) builds one Runtime and passes it
down. The registry is replaced whole on reload; readers take one reference per job.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runner.config import Config
from runner.store import routing, shards, tagset
from runner.store.keys import QueueKeys, for_partitions, home_partition, partition_set, partition_tags, place_prefix

if TYPE_CHECKING:
    from runner.catalog.registry import Registry
    from runner.store.records import ScriptRunner
    from runner.store.scripts import Scripts
    from runner.store.waiter import Waiter

RETRY_S = 1.0  # after the recorded partition tags could not be read
# A reader (a list, a look-up, a scrape) reads the recorded tags again this often, and
# again whenever a look-up finds no such job: a process on another count (a rolling
# deploy's new release) may have placed it on a tag this one has not read yet.
READ_EVERY_S = 1.0
# How long a look-up that missed waits for that read: a Cluster master that holds the set
# and stalls is not waited out (15 s) by every "no such job".
MISSED_WAIT_S = 2.0
# A reader waits for a read of the tags this much longer: on Redis Cluster that read gives
# a stalled master up itself at 2 s (Transport.each_master), and the reader goes on once
# it is marked, so its own read skips it, rather than meet it unmarked a moment early and
# wait 2 s more.
MARK_MARGIN_S = 0.25
# A count of partitions is looked up this long past the done retention after a process
# last routed by it: its jobs' keys outlive their enqueue by up to their run and a retention.
KEEP_MARGIN_S = 3600.0


def layout(config: Config) -> tuple[dict[str, QueueKeys], dict[str, list[QueueKeys]]]:
    """Each queue's home partition keys, and every partition's, by index."""
    parts = {q: list(for_partitions(config.redis.prefix, q, c.partitions)) for q, c in config.queues.items()}
    return {q: p[home_partition(q, len(p))] for q, p in parts.items()}, parts


@dataclass(slots=True)
class Runtime:
    config: Config
    redis: Any
    # Each queue's home partition (its own tag: with partitions = 1, its only one)...
    keys: dict[str, QueueKeys] = field(default_factory=dict)
    # ...and every partition, by index (see docs/partitions.md): the current count's
    # first, then those of other counts still recorded (draining; the list only grows,
    # so an index a claimed job carries stays valid).
    parts: dict[str, list[QueueKeys]] = field(default_factory=dict)
    # Per queue with other counts of partitions processes routed by lately (tagset.py):
    # where those counts put keyed jobs, looked up too (routing.Placement).
    placements: dict[str, routing.Placement] = field(default_factory=dict)
    _registry: Registry | None = None
    _scripts: Scripts | None = None
    _waiter: Waiter | None = None
    _discovered_at: float = float("-inf")
    _recorded_at: float = float("-inf")
    _discovering: threading.Lock = field(default_factory=threading.Lock)
    _aside: threading.Thread | None = None  # a discover_due(aside=True) under way
    _missing: threading.Thread | None = None  # a discover_missed under way
    _swapped: list[Callable[[], None]] = field(default_factory=list)  # told of a registry swap

    @classmethod
    def create(cls, config: Config, reg: Registry | None = None, *, lazy: bool = False, reader: bool = False,
               record: bool = False, **redis_overrides: Any) -> Runtime:
        """``lazy``: load functions/ and schemas/ and assemble the scripts on first use of
        ``registry`` and ``scripts``, for the commands that may never need them (`runner
        job`, `runner stats`): importing every handler, compiling every schema and
        assembling every Lua script would be most of their run time.

        ``reader``: for a command that reads a little and exits, a connection of the store's
        own (store/link.py) instead of redis-py's client when the URL allows one: importing
        redis-py would cost such a command more than everything else it does. Its reads go
        through ``redis`` (a pipeline of plain reads) and ``read_scripts``, never
        ``scripts``.

        ``record``: add this process's partition tags to the queues' recorded sets (a
        process that routes or serves jobs; a reader or `runner check` only reads them)."""
        client = None
        if reader and not redis_overrides:
            from runner.store import link

            client = link.from_config(config.redis)
        if client is None:
            from runner.store import connection

            client = connection.connect(config.redis, **redis_overrides)
        keys, parts = layout(config)
        rt = cls(config=config, redis=client, keys=keys, parts=parts, _registry=reg)
        rt.discover_bounded(record=record)
        if not lazy:  # a process starts with its functions and scripts ready
            rt.registry  # noqa: B018
            rt.scripts.prepare()
        return rt

    def discover(self, *, record: bool = False, skip: frozenset[str] = frozenset()) -> list[QueueKeys]:
        """Read the partition tags recorded for every queue (tagset.py), adding this
        process's own with ``record``; the tags of other counts join ``parts`` as draining
        partitions. Returns those new here. Redis away: nothing new, the next call retries.
        ``skip``: queues whose tags are not read now (their set's master is stalled): the
        next discover_due, a second on, reads every queue's again."""
        prefix = self.config.redis.prefix
        with self._discovering:  # threads of one process (web threads, the scheduler) append once
            now = time.monotonic()
            try:
                seen, away = self._record_and_read(
                    {q: [k.tag for k in p if not k.draining] for q, p in self.parts.items() if q not in skip},
                    record=record)
                skip |= away
            except Exception as exc:  # a damaged set must not stop a process: its own tags serve
                # Look again in a second, not on every call: while Redis is away each
                # enqueue would otherwise wait out a failed connection twice.
                self._recorded_at = now - tagset.RECORD_EVERY_S + RETRY_S
                self._discovered_at = now - READ_EVERY_S + RETRY_S
                # logging loads here: a CLI command that never fails here never pays its import.
                import logging

                from runner.store.link import is_outage

                log = logging.getLogger("runner")
                if is_outage(exc):
                    log.debug("partition tags not read (Redis unreachable): %s", exc)
                else:
                    log.warning("partition tags of %s not read: %s", ", ".join(self.parts), exc)
                return []
            # (the queues skipped: read again a second on)
            self._discovered_at = now if not skip else now - READ_EVERY_S + RETRY_S
            if record:
                self._recorded_at = now if not skip else now - tagset.RECORD_EVERY_S + RETRY_S
            new: list[QueueKeys] = []
            for q, tags in seen.tags.items():
                # (never the current count's own: one a reading command left out as its
                # master is down stays out)
                own = set(partition_tags(q, self.config.queues[q].partitions))
                extra = tagset.draining_keys(prefix, q, self.parts[q], [t for t in tags if t not in own])
                self.parts[q].extend(extra)
                new += extra
            self.placements = {**{q: p for q, p in self.placements.items() if q in skip},
                               **{q: self._placement(q, others) for q, c in seen.counts.items()
                                  if (others := tuple(n for n in c if n != self.config.queues[q].partitions))}}
            if self._scripts is not None:
                self._scripts.changing = frozenset(self.placements)
            if record:
                self._keep_counts(seen)
        if new and self._waiter is not None:
            self._waiter.extend([k.ended for k in new])
        return new

    def _record_and_read(self, tags: dict[str, list[str]], *, record: bool) -> tuple[tagset.Recorded, frozenset[str]]:
        """tagset.record_and_read_all of the queues of ``tags``, and the queues whose tags
        were not read. On Redis Cluster each master's sets on their own, every master at
        once and each waited for at most a reader's bound (Transport.each_master): a master
        that does not answer (stalled) is marked, its queues come back unread (read again a
        second on, at once skipped while it stays marked), and the reads of jobs and
        figures after it skip it at once too, rather than each wait 2 s for it again."""
        prefix, counts = self.config.redis.prefix, {q: c.partitions for q, c in self.config.queues.items()}
        if not shards.on_cluster(self.redis):  # (one server, Sentinel, a reader's link)
            return tagset.record_and_read_all(self.redis, prefix, tags, counts, record=record,
                                              keep_s=self.key_life_s), frozenset()
        from runner.store.transport import READ_WAIT_S

        names = list(tags)

        def read(idx: list[int]) -> list[tagset.Recorded]:
            return [tagset.record_and_read_all(self.redis, prefix, {names[i]: tags[names[i]] for i in idx}, counts,
                                               record=record, keep_s=self.key_life_s)] * len(idx)

        scripts = self.scripts
        with scripts.waiting(READ_WAIT_S):
            got, away = scripts.each_master([partition_set(prefix, q) for q in names], read,
                                            "a read of the partition tags")
        seen = tagset.Recorded({}, {})
        for q, one in zip(names, got, strict=True):
            if one is not None:
                seen.tags[q] = one.tags[q]
                if q in one.counts:
                    seen.counts[q] = one.counts[q]
        return seen, frozenset(names[i] for i in away)

    def discover_bounded(self, *, record: bool = False) -> list[QueueKeys]:
        """``discover``; while a Redis Cluster master is stalled (it took the client's
        connection as it was built and said nothing: connection.py's probe), the queues
        whose tag sets live on it are left for a later discover_due (a second on), so a
        process starts on its own partitions rather than wait out the stall; the others'
        are read on a thread waited for as long as the probe was ([] when it has not
        answered by then: docs/partitions.md, "A shard down")."""
        stalled = getattr(self.redis, "runner_stalled", None)
        if not stalled:
            return self.discover(record=record)
        import threading

        from runner.store.connection import PROBE_S
        from runner.store.shards import node_of

        prefix = self.config.redis.prefix
        skip = frozenset(q for q in self.parts if node_of(self.redis, partition_set(prefix, q)) in stalled)
        found: list[list[QueueKeys]] = []
        aside = threading.Thread(target=lambda: found.append(self.discover(record=record, skip=skip)),
                                 name="runner-discover", daemon=True)
        aside.start()
        aside.join(PROBE_S)
        return found[0] if found else []

    @property
    def key_life_s(self) -> float:
        """How long a key may live in a partition after its last job there: the longest of
        the done and idempotency retentions, and a margin for hosts' clocks. An old count
        is looked up that long after a process last routed by it (tagset.py)."""
        ret = self.config.retention
        return max(ret.done_s, ret.idempotency_s) + KEEP_MARGIN_S

    def _keep_counts(self, seen: tagset.Recorded) -> None:
        """Say again each old count one of whose partitions is still recorded (a job
        waits there, delayed for hours, or a busy key keeps going there, or it drained
        less than a retention ago): its keys there are looked up as long as they may
        live, however long ago its last producer stopped."""
        keep: dict[str, list[int]] = {}
        for q, counts in seen.counts.items():
            own = set(partition_tags(q, self.config.queues[q].partitions))
            recorded = set(seen.tags.get(q, ())) - own
            keep[q] = [m for m in counts if m != self.config.queues[q].partitions
                       and recorded & set(partition_tags(q, m))]
        if any(keep.values()):
            tagset.say_counts(self.redis, self.config.redis.prefix, keep)

    def _placement(self, queue: str, others: tuple[int, ...]) -> routing.Placement:
        """Where the ``others`` counts put a keyed job of ``queue``: each count's partitions
        by index, as this process's keys (None for a tag no longer recorded: drained)."""
        by_tag = {k.tag: k for k in self.parts[queue]}
        return routing.Placement(tuple((m, tuple(by_tag.get(t) for t in partition_tags(queue, m)))
                                       for m in others),
                                 claims=place_prefix(self.config.redis.prefix, queue),
                                 claim_ms=int(self.key_life_s * 1000))

    def record_due(self) -> bool:
        """Whether a producer's next enqueue records its partition tags (see discover_due)."""
        return time.monotonic() - self._recorded_at >= tagset.RECORD_EVERY_S

    def discover_due(self, *, record: bool = False, aside: bool = False, wait_s: float = 0.0) -> list[QueueKeys]:
        """``discover`` when the last one (that recorded, with ``record``) is older than
        tagset.RECORD_EVERY_S (a reader's: READ_EVERY_S): a producer records its tags at
        its first enqueue and then that often; the check itself is one clock read. ``aside``: once a first one is
        done, the next run on a thread of their own and this call returns at once (an
        enqueue's round trip waits on its own master only: on Redis Cluster the tag sets
        live on every master, and one may be stalled), or once that thread ended or
        ``wait_s`` passed."""
        last = self._recorded_at if record else self._discovered_at
        if time.monotonic() - last < (tagset.RECORD_EVERY_S if record else READ_EVERY_S):
            return []
        if self._discovering.locked():
            # Another thread reads them now, and may be waiting out a stalled node: this
            # caller goes on with the tags it has rather than wait behind it.
            return []
        if aside and last > float("-inf"):
            aside_run = self._aside
            if aside_run is None or not aside_run.is_alive():
                aside_run = self._aside = threading.Thread(target=self.discover, kwargs={"record": record},
                                                           name="runner-discover", daemon=True)
                aside_run.start()
                if wait_s:
                    aside_run.join(wait_s)
            return []
        return self.discover_bounded(record=record)

    def discover_for_reading(self) -> None:
        """A reader's discover_due (a list, a look-up, a scrape): on a thread, waited for
        MISSED_WAIT_S at most, so the read sees the tags recorded a moment ago, yet a Redis
        that stopped answering costs it its own socket timeout only, not that one too (and
        while one such read waits, the next readers go on with the tags they have)."""
        self.discover_due(aside=True, wait_s=MISSED_WAIT_S + MARK_MARGIN_S)

    def discover_missed(self, searched: Collection[QueueKeys]) -> list[QueueKeys]:
        """After a look-up in ``searched`` found no such job: the recorded tags read again,
        in case the job is on a tag of another count that this process had not read yet.
        The partitions known now that the look-up did not search, or [] (then the job is
        not there either): whichever thread's read found them, as a read under way in
        another thread when the look-up started may add them before this one's.
        A read is on a thread, waited for MISSED_WAIT_S at most, one at a time (a miss
        while one is under way waits for that one): a master that holds the recorded set
        and stalls costs a miss that long, not its socket timeout."""
        missing = self._missing
        if missing is None or not missing.is_alive():
            missing = self._missing = threading.Thread(target=self.discover_bounded,
                                                       name="runner-discover-missed", daemon=True)
            missing.start()
        missing.join(MISSED_WAIT_S + MARK_MARGIN_S)
        known = {(k.queue, k.tag) for k in searched}
        return [k for parts in self.parts.values() for k in parts if (k.queue, k.tag) not in known]

    @property
    def scripts(self) -> Scripts:
        if self._scripts is None:
            from runner.store.scripts import Scripts

            r = self.config.redis
            self._scripts = Scripts(self.redis, replicas=r.wait_replicas, replica_timeout_s=r.wait_timeout_s,
                                    mark_ms=int((self.config.retention.done_s + KEEP_MARGIN_S) * 1000))
            self._scripts.changing = frozenset(self.placements)
        return self._scripts

    @property
    def read_scripts(self) -> ScriptRunner:
        """What runs the read-only scripts (records.lookup): ``scripts``, or on a Link (a
        ``reader`` runtime's) batches of the Link's own, which import no redis-py."""
        from runner.store import link, transport

        if isinstance(self.redis, link.Link):
            return transport.LinkScripts(self.redis)
        return self.scripts

    @property
    def waiter(self) -> Waiter:
        """The process's one subscriber for waits on job ends (built on first use; a
        forked child builds its own, as the parent's connection is not its to use)."""
        import os

        if self._waiter is None or self._waiter.pid != os.getpid():
            from runner.store.waiter import Waiter

            self._waiter = Waiter(self.redis, [k.ended for parts in self.parts.values() for k in parts],
                                  scripts=lambda: self.read_scripts)
        return self._waiter

    @property
    def registry(self) -> Registry:
        if self._registry is None:
            from runner.catalog import registry
            from runner.store import codec

            self._registry = registry.load(self.config, payload_check=codec.payload_problem)
        return self._registry

    @registry.setter
    def registry(self, reg: Registry) -> None:
        self._registry = reg
        for tell in list(self._swapped):
            tell()

    def on_swap(self, tell: Callable[[], None]) -> Callable[[], None]:
        """Call ``tell`` whenever a new registry is swapped in (a reload), so a part that
        sleeps long (the ticker) adopts it at once; returns what undoes it."""
        self._swapped.append(tell)
        return lambda: self._swapped.remove(tell)

    def reload(self) -> Registry:
        """Load functions/ and schemas/ again; broken files keep their last good version."""
        from runner.catalog import registry
        from runner.store import codec

        self.registry = registry.load(self.config, previous=self.registry, payload_check=codec.payload_problem)
        return self.registry

    def close(self) -> None:
        if self._waiter is not None:
            self._waiter.stop()
        watch = getattr(getattr(self.redis, "connection_pool", None), "runner_watch", None)
        if watch is not None:  # a Sentinel client's (store/sentinel.py)
            watch.close()
        self.redis.close()
