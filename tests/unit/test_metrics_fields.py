"""The stats fields a settlement carries, and their sum over a batch (sent once with it)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from runner.observe import metrics


def _add(counter: Counter[str], fields: str) -> None:
    """How the scripts count a fields string (bump in includes/stats.lua): "f" adds 1, "f=N" adds N."""
    for tok in fields.split():
        name, eq, n = tok.rpartition("=")
        if eq and n.isdigit():
            counter[name] += int(n)
        else:
            counter[tok] += 1


@given(st.lists(st.tuples(st.sampled_from(["noop", "send_email"]), st.floats(-5, 100_000), st.floats(0, 70_000)),
                max_size=40))
def test_the_batch_totals_count_what_every_jobs_fields_count(runs: list[tuple[str, float, float]]) -> None:
    """succeeded() gives each job "succeeded|<type>" and the fields of timing_fields(), and
    the batch's totals count exactly what counting each job's fields would."""
    totals = metrics.Totals()
    one_by_one: Counter[str] = Counter()
    for type_, lat, run in runs:
        fields = metrics.succeeded(type_, lat, run, totals)
        assert fields == f"succeeded|{type_} " + metrics.timing_fields(type_, lat, run)
        _add(one_by_one, fields)
    summed: Counter[str] = Counter()
    _add(summed, totals.text())
    assert summed == one_by_one


def test_a_type_no_function_can_have_is_counted_as_malformed() -> None:
    """The worker's stats fields name a record's type as another producer wrote it: "a b"
    was counted as "dead|a" and "b", and "x=9" added 9 to "dead|x". A name no function can
    have (not an identifier, or past the longest file stem) is counted as "?"."""
    assert metrics.counted("send_email") == "send_email" and metrics.counted("opé") == "opé"
    for bad in ("a b", "x=9", "a|b", "", "x" * 253, "é" * 127):
        assert metrics.counted(bad) == metrics.MALFORMED, bad
    assert metrics.counted("x" * 252) == "x" * 252
