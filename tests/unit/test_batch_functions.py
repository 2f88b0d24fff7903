"""BATCH functions without Redis: the option's refusals (each saying what to fix), the
handle_batch it needs, run_inline with a list of payloads (per-item outcomes, partial
failures, key grouping, size cuts, wrong-length results), and the batch ctx's refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner import config
from runner.catalog import registry
from runner.testing import run_inline

SCHEMA = {"type": "object", "properties": {"tenant": {"type": "string"}, "n": {"type": "integer"}}}
BATCH_FN = '''
import runner
BATCH = {"size": 3, "wait": 0.1, "key": "t:{tenant}"}

def handle_batch(payloads, ctx):
    if any(p.get("boom") for p in payloads):
        raise RuntimeError("the whole batch fails")
    bad = {i: runner.PermanentFailure("no " + str(p["n"])) for i, p in enumerate(payloads) if p.get("bad")}
    results = [{"n": p["n"], "with": [q["n"] for q in payloads], "id": ctx.jobs[i].id,
                "attempt": ctx.jobs[i].attempt} for i, p in enumerate(payloads)]
    if bad:
        return runner.BatchFailures(bad, results=results)
    return results
'''


def load(tmp_path: Path, src: str, schema: object = SCHEMA) -> registry.Registry:
    (tmp_path / "runner.toml").write_text("[queues.fast]\nvisibility_timeout = 30\n")
    (tmp_path / "functions").mkdir(exist_ok=True)
    (tmp_path / "functions" / "fn.py").write_text(src)
    (tmp_path / "schemas" / "fn").mkdir(parents=True, exist_ok=True)
    (tmp_path / "schemas" / "fn" / "v1.json").write_text(json.dumps(schema))
    return registry.load(config.load(tmp_path / "runner.toml", env={}))


def error_of(reg: registry.Registry) -> str:
    (err,) = reg.errors.values()
    return str(err)


HB = "def handle_batch(payloads, ctx):\n    return None\n"


@pytest.mark.parametrize("source,message", [
    ('BATCH = {"size": 10}\n' + HB, 'BATCH must be a dict with "size", "wait" and optionally "key"'),
    ('BATCH = {"size": 0, "wait": 1}\n' + HB, 'BATCH "size" must be an integer from 1 to 1000, got 0'),
    ('BATCH = {"size": 5, "wait": -1}\n' + HB, 'BATCH "wait" must be a number of seconds from 0 to 60, got -1'),
    ('BATCH = {"size": 5, "wait": 1, "key": "{nope}"}\n' + HB, "BATCH key names field 'nope'"),
    ('CONCURRENCY = 10\nBATCH = {"size": 50, "wait": 1}\n' + HB,
     'BATCH "size" 50 is above CONCURRENCY 10: each member of a batch holds a concurrency slot'),
    ('RESOURCE_KEY = "t:{tenant}"\nBATCH = {"size": 5, "wait": 1}\n' + HB, "BATCH and RESOURCE_KEY exclude"),
    ('BATCH = {"size": 5, "wait": 1}\ndef handle(p, c):\n    pass\n', "BATCH needs a handle_batch(payloads, ctx)"),
    ('BATCH = {"size": 5, "wait": 1}\ndef handle_batch(payloads):\n    pass\n',
     "handle_batch must take exactly (payloads, ctx)"),
    ("def handle(p, c):\n    pass\n" + HB, "handle_batch is defined but BATCH is not"),
])
def test_batch_option_refusals(tmp_path: Path, source: str, message: str) -> None:
    assert message in error_of(load(tmp_path, source))


def test_a_batch_function_needs_no_handle_and_describes_its_batch(tmp_path: Path) -> None:
    reg = load(tmp_path, BATCH_FN)
    fn = reg.get("fn")
    assert fn.batch is not None and fn.handle_batch is not None
    assert fn.describe()["batch"] == {"size": 3, "wait": 0.1, "key": "t:{tenant}"}
    with pytest.raises(TypeError, match="handle_batch"):
        fn.handle({}, None)


def test_run_inline_takes_a_list_and_answers_one_outcome_per_payload(tmp_path: Path) -> None:
    """Grouped by rendered key and cut to BATCH size, as a worker would: 4 of tenant a go
    in calls of 3 and 1, 1 of tenant b alone; each outcome is its own item's."""
    reg = load(tmp_path, BATCH_FN)
    payloads = [{"tenant": "a", "n": 0}, {"tenant": "b", "n": 1}, {"tenant": "a", "n": 2},
                {"tenant": "a", "n": 3}, {"tenant": "a", "n": 4}]
    out = run_inline("fn", payloads, registry=reg, job_id="j")
    assert [o.status for o in out] == ["done"] * 5
    assert [o.result["n"] for o in out] == [0, 1, 2, 3, 4]
    assert [o.result["with"] for o in out] == [[0, 2, 3], [1], [0, 2, 3], [0, 2, 3], [4]]
    assert [o.result["id"] for o in out] == [f"j.{i}" for i in range(5)]


def test_run_inline_partial_and_whole_failures(tmp_path: Path) -> None:
    reg = load(tmp_path, BATCH_FN)
    out = run_inline("fn", [{"tenant": "a", "n": 0}, {"tenant": "a", "n": 1, "bad": True}], registry=reg)
    assert [o.status for o in out] == ["done", "dead"]
    assert out[1].reason == "permanent failure" and out[1].error["message"] == "no 1"
    out = run_inline("fn", [{"tenant": "a", "n": 0}, {"tenant": "a", "n": 1, "boom": True}], registry=reg)
    assert [o.status for o in out] == ["retry", "retry"]
    assert out[0].error["message"] == "the whole batch fails"
    out = run_inline("fn", [{"tenant": "a", "n": 0}, {"tenant": "a", "n": "x"}], registry=reg)
    assert [o.status for o in out] == ["done", "dead"], "an invalid payload never reaches the call"
    assert out[0].result["with"] == [0] and out[1].reason == "invalid payload"


def test_run_inline_refuses_a_single_payload_for_a_batch_function(tmp_path: Path) -> None:
    reg = load(tmp_path, BATCH_FN)
    with pytest.raises(TypeError, match="takes a list of payloads"):
        run_inline("fn", {"tenant": "a", "n": 0}, registry=reg)
    with pytest.raises(TypeError, match="not a batch's"):
        run_inline("fn", [{"n": 0}], registry=reg, checkpoint=1)


@pytest.mark.parametrize("returned,message", [
    ("[1]", "handle_batch returned a list of 1 for a batch of 2 payloads"),
    ("{}", "handle_batch returned dict for a batch of 2 payloads"),
    ("runner.BatchFailures({5: ValueError('x')})", "BatchFailures names index(es) [5], outside this batch of 2"),
])
def test_a_wrong_result_buries_every_item_with_a_clear_error(tmp_path: Path, returned: str, message: str) -> None:
    reg = load(tmp_path, f'import runner\nBATCH = {{"size": 5, "wait": 0}}\n'
                         f'def handle_batch(payloads, ctx):\n    return {returned}\n')
    out = run_inline("fn", [{"n": 0}, {"n": 1}], registry=reg)
    assert [o.status for o in out] == ["dead", "dead"]
    assert message in out[0].error["message"]


@pytest.mark.parametrize("call,message", [
    ("ctx.job_id", "a batch has no single job id: ctx.jobs[i].id"),
    ("ctx.step('a', lambda: 1)", "durable calls are one job's"),
    ("ctx.sleep('a', 1)", "a batch cannot sleep"),
    ("ctx.enqueue('fn', {})", "follow-up jobs are held on one job's run"),
    ("ctx.save_checkpoint(1)", "checkpoints are one job's"),
])
def test_the_batch_ctx_refuses_one_jobs_calls_clearly(tmp_path: Path, call: str, message: str) -> None:
    reg = load(tmp_path, f'BATCH = {{"size": 5, "wait": 0}}\ndef handle_batch(payloads, ctx):\n    {call}\n')
    [out] = run_inline("fn", [{"n": 0}], registry=reg)
    assert (out.status, out.reason) == ("dead", "permanent failure")
    assert message in out.error["message"]
