"""Flow control's cost (issue 22): the drain of plain no-ops, of no-ops under a per-key
CONCURRENCY limit (2 per key, jobs spread evenly over 100 keys) and of no-ops under a
global RATE_LIMIT far above capacity, side by side in one run on one server, with the
harness' runner workers (2 processes x 16 threads) for all three. Neither limit binds, so
what each ratio to the plain drain shows is the checks' own cost. The plain drain is also
set against the runner drain of the last full run (bench/results/latest.json, or the
newest full run there), which it must stay within 5 % of: unused, the checks cost nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

from harness import scenarios
from harness.scenarios import Env
from harness.systems import BENCH, FLOW_KEY_LIMIT, FLOW_KEYS, FLOW_RATE, System, flow_project, runner_system

RESULTS = BENCH / "results"
RATIO_TARGET = 0.70  # each limited drain over the plain one
BASELINE_TOLERANCE = 0.05  # the plain drain under the last full run's

CASES = {
    "plain": "plain no-op",
    "concurrency": f'CONCURRENCY = {{"key": "tenant:{{k}}", "limit": {FLOW_KEY_LIMIT}}}, {FLOW_KEYS} keys',
    "rate": f'RATE_LIMIT = {{"limit": {FLOW_RATE:_}, "period": 1}}',
}


def last_full_run(results: Path = RESULTS) -> dict[str, Any] | None:
    """The runner no-op drain (`systems.runner.drain`) of the newest full run in results/:
    latest.json, unless a quick run wrote it, then the newest dated full run."""
    runs: list[tuple[str, bool, str, dict[str, Any]]] = []
    for f in results.glob("*.json"):
        try:
            data = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if not isinstance(data, dict) or data.get("config", {}).get("mode") != "full":
            continue
        if ((data.get("systems") or {}).get("runner") or {}).get("drain"):
            runs.append((str(data.get("date", "")), f.name == "latest.json", f.name, data))
    if not runs:
        return None
    _, _, name, data = max(runs, key=lambda r: r[:2])  # on a tie, latest.json
    return {"file": name, "date": data.get("date", "?"), "commit": data.get("runner_source", {}).get("commit", "?"),
            "jobs": data["config"].get("drain_n"), "drain": data["systems"]["runner"]["drain"]}


def _sample_limits(env: Env, toml: Path, out: dict[str, str]) -> scenarios.Hook:
    """A hook that reads the limits of the first queued job: proof the case is limited."""
    def hook() -> None:
        from runner import config as config_mod
        from runner.store import keys, records

        cfg = config_mod.load(toml, env={"REDIS_URL": env.url})
        k = keys.for_queue(cfg.redis.prefix, "fast")
        r = env.redis.client()
        first = r.lindex(k.ready, 0)
        rec = records.parse(r.get(k.job(first))) if first else None
        out["limits"] = (rec or {}).get("limits", "")
    return hook


def _held_back(env: Env, toml: Path) -> dict[str, int]:
    """Claims the limits held back in the drain just run (the stats hash, by reason)."""
    from runner import config as config_mod
    from runner.store import keys

    cfg = config_mod.load(toml, env={"REDIS_URL": env.url})
    stats = cast(dict[str, str], env.redis.client().hgetall(keys.for_queue(cfg.redis.prefix, "fast").stats))
    out = {"deferred": 0, "ratelimited": 0}
    for field, n in stats.items():
        reason = field.split("|", 1)[0]
        if reason in out:
            out[reason] += int(n)
    return out


def run(env: Env, n: int, reps: int, cap_s: float) -> dict[str, Any]:
    toml = flow_project(env.work / "flow-project")
    plain = runner_system(toml)
    cases: dict[str, System] = {
        "plain": plain,
        "concurrency": plain.with_env(BENCH_RUNNER_TYPE="noop_keyed", BENCH_RUNNER_KEYS=str(FLOW_KEYS)),
        "rate": plain.with_env(BENCH_RUNNER_TYPE="noop_rated", BENCH_RUNNER_KEYS="none"),
    }
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in cases}
    limits: dict[str, dict[str, str]] = {c: {} for c in cases}
    for rep in range(reps):  # interleaved: drift on the machine hits every case alike
        for case, s in cases.items():
            d = scenarios.drain(env, s, n, cap_s, before_workers=_sample_limits(env, toml, limits[case]))
            d["held_back"] = _held_back(env, toml)
            runs[case].append(d)
            print(f"    {rep + 1}/{reps} {case}: {d['jobs_per_s']:,.0f} jobs/s "
                  f"({d['jobs']:,}/{d['queued']:,} jobs, held back {d['held_back']})", flush=True)
    out: dict[str, Any] = {"jobs": n, "reps": reps, "cap_s": cap_s, "workers": plain.note, "cases": {}}
    for case, r in runs.items():
        out["cases"][case] = {
            "label": CASES[case], "limits": limits[case].get("limits", ""),
            "drain": scenarios.summary(r, "jobs_per_s"),
            "complete": all(d["complete"] for d in r),
            "held_back": {k: sum(d["held_back"][k] for d in r) for k in ("deferred", "ratelimited")},
            "worker_cpu_ms_per_job": scenarios.summary(r, "worker_cpu_ms_per_job"),
            "redis_cpu_ms_per_job": scenarios.summary(r, "redis_cpu_ms_per_job"),
            "commands_per_job": scenarios.summary(r, "commands_per_job"),
            "runs": r,
        }
    base = out["cases"]["plain"]["drain"]
    for case in ("concurrency", "rate"):
        d = out["cases"][case]["drain"]
        if base and d:
            ratio = d["median"] / base["median"]
            out["cases"][case].update(ratio=ratio, meets_target=ratio >= RATIO_TARGET)
    ref = last_full_run()
    if ref and base:
        # Faster than the last full run is no failure: the target is no slowdown past 5 %.
        change = base["median"] / ref["drain"]["median"] - 1
        ref.update(change=change, within=change >= -BASELINE_TOLERANCE)
    out["last_full_run"] = ref
    return out


def _num(v: float | None, digits: int = 0) -> str:
    return "n/a" if v is None else f"{v:,.{digits}f}"


def _cell(s: dict[str, float] | None, digits: int = 0) -> str:
    if not s:
        return "n/a"
    return (_num(s["median"], digits) if s["min"] == s["max"]
            else f"{_num(s['median'], digits)} ({_num(s['min'], digits)}-{_num(s['max'], digits)})")


def markdown(res: dict[str, Any]) -> list[str]:
    out = [f"**Flow control's cost (issue 22)**: {res['jobs']:,} no-op jobs per drain, medians of "
           f"{res['reps']}, interleaved; workers: {res['workers']}", "",
           "| drain | jobs/s | ratio to plain | held back (deferred / rate limited) | worker CPU ms/job "
           "| Redis CPU ms/job | Redis cmds/job |",
           "|---|---|---|---|---|---|---|"]
    for case, c in res["cases"].items():
        ratio = "" if case == "plain" else (
            f"{c['ratio'] * 100:.0f} % ({'meets' if c['meets_target'] else 'misses'} "
            f"{RATIO_TARGET * 100:.0f} %)" if "ratio" in c else "n/a")
        label = f"`{c['label']}`" if case != "plain" else c["label"]
        out.append(f"| {label}{'' if c['complete'] else ' (not drained within the cap)'} | "
                   f"{_cell(c['drain'])} | {ratio} | {c['held_back']['deferred']} / "
                   f"{c['held_back']['ratelimited']} | {_cell(c['worker_cpu_ms_per_job'], 3)} | "
                   f"{_cell(c['redis_cpu_ms_per_job'], 3)} | {_cell(c['commands_per_job'], 1)} |")
    ref, plain = res.get("last_full_run"), res["cases"]["plain"]["drain"]
    out.append("")
    if ref and plain:
        out.append(f"Plain drain against the last full run's runner drain ({ref['file']}, {ref['date']}, "
                   f"commit {ref['commit']}, {ref['jobs']:,} jobs): {plain['median']:,.0f} against "
                   f"{ref['drain']['median']:,.0f} jobs/s, {ref['change'] * 100:+.1f} % "
                   f"({'within' if ref['within'] else 'NOT within'} "
                   f"{BASELINE_TOLERANCE * 100:.0f} %).")
    else:
        out.append("No full run in bench/results to compare the plain drain with.")
    return [*out, ""]
