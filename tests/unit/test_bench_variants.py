"""The benchmark's metrics-off build patches runner's sources by exact text: when a
script changes under it, the benchmark scenario fails at run time, after twenty minutes.
This says so at once."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_the_metrics_off_patches_still_apply(tmp_path: Path) -> None:
    sys.path.insert(0, str(BENCH))
    try:
        from harness import variants
    finally:
        sys.path.remove(str(BENCH))
    out = variants.copy_runner(tmp_path, variants.METRICS_OFF)
    includes = out / "runner" / "store" / "lua" / "includes"
    assert "local function bump(fields)\n  if true then return end\n" in (includes / "stats.lua").read_text()
    assert "'enqueued|'" not in (includes / "jobs.lua").read_text()
    assert not any(d.startswith("redis") for d in variants.RUNNER_DEPS)
    assert any(d.startswith("cronsim") for d in variants.RUNNER_DEPS)
