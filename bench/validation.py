"""What refusing an invalid payload costs: ``Schema.errors`` on hostile payloads, by shape
and size, in wall time and in the longest stretch it held the GIL (what a web process's
event loop, or a worker's lease renewer, waits meanwhile). No Redis.

    python bench/validation.py                     # the shipped path, up to 1 MiB
    python bench/validation.py --full              # every error listed at every size: the
                                                   # curve LIST_BYTES is chosen on
    python bench/validation.py --src ../other      # another checkout's runner/, for an A/B
    python bench/validation.py --sizes 8 1024 --rounds 1 --shapes items union

Shapes, each a payload whose every value is wrong, grown to the size asked (KiB encoded):

- items: ``{"a": [0, 0, ...]}`` against ``items: {"type": "string"}``;
- anyof: the same against ``items: {"anyOf": [string, object]}``;
- union: a root ``oneOf`` of two kinds of object, each with such an array (the compiler
  builds every error of both branches for its one error);
- nested: arrays of 50 zeros against ``items: {"items": {"anyOf": ...}}``;
- names: short property names past ``propertyNames: {"maxLength": 2}``;
- quoting: arrays nested 60 deep around a long string, each level past ``maxItems: 0``
  (each error quotes the whole array it is about).

Writes results/validation.json and .md unless --no-write.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"

_BRANCH = {"type": "object", "required": ["kind"], "properties": {
    "kind": {"const": "x"}, "a": {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "object"}]}}}}
_NODE = {"$defs": {"n": {"type": "array", "maxItems": 0, "items": {"$ref": "#/$defs/n"}}}, "$ref": "#/$defs/n"}


def _deep(n: int) -> Any:
    value: Any = "x" * n
    for _ in range(60):
        value = [value]
    return value


SHAPES: dict[str, tuple[dict[str, Any], Callable[[int], Any]]] = {
    "items": ({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string"}}}},
              lambda n: {"a": [0] * n}),
    "anyof": ({"type": "object", "properties": {"a": _BRANCH["properties"]["a"]}}, lambda n: {"a": [0] * n}),
    "union": ({"oneOf": [_BRANCH, {**_BRANCH, "properties": {**_BRANCH["properties"], "kind": {"const": "y"}}}]},
              lambda n: {"kind": "z", "a": [0] * n}),
    "nested": ({"type": "array", "items": {"type": "array", "items": _BRANCH["properties"]["a"]["items"]}},
               lambda n: [[0] * 50 for _ in range(max(1, n // 50))]),
    "names": ({"type": "object", "propertyNames": {"maxLength": 2}}, lambda n: {f"{i:06d}": 0 for i in range(n // 5)}),
    "quoting": (_NODE, lambda n: _deep(n * 2)),
}


def sized(make: Callable[[int], Any], kib: int) -> Any:
    """``make(n)`` with n as large as keeps it within ``kib`` KiB encoded (bisection)."""
    limit = kib * 1024
    lo, hi = 1, 2
    while len(json.dumps(make(hi), separators=(",", ":"))) <= limit:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if len(json.dumps(make(mid), separators=(",", ":"))) <= limit else (lo, mid)
    return make(lo)


def held(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(wall seconds, the longest gap a 1 ms ticker thread saw, fn's result)."""
    stop = threading.Event()
    worst = [0.0]

    def tick() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            worst[0] = max(worst[0], now - last)
            last = now

    t = threading.Thread(target=tick)
    t.start()
    time.sleep(0.01)
    worst[0] = 0.0
    t0 = time.perf_counter()
    out = fn()
    wall = time.perf_counter() - t0
    stop.set()
    t.join()
    return wall, worst[0], out


def measure(shapes: list[str], sizes: list[int], rounds: int, full: bool) -> list[dict[str, Any]]:
    from runner.catalog import listing, schemas

    if full:
        listing.LIST_BYTES = 1 << 40  # every error listed, whatever the size
    root = Path(tempfile.mkdtemp(prefix="bench-validation-"))
    rows = []
    for shape in shapes:
        doc, make = SHAPES[shape]
        path = root / "schemas" / shape / "v1.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(doc))
        schema = schemas.load_schema(path, 1)
        for kib in sizes:
            payload = sized(make, kib)
            encoded = len(json.dumps(payload, separators=(",", ":")))
            runs = [held(functools.partial(schema.errors, payload)) for _ in range(rounds)]
            walls = [r[0] for r in runs]
            row = {"shape": shape, "kib": kib, "bytes": encoded, "errors": len(runs[0][2]),
                   "ms_min": 1e3 * min(walls), "ms_median": 1e3 * statistics.median(walls),
                   "gil_ms_max": 1e3 * max(r[1] for r in runs)}
            rows.append(row)
            print(f"{shape:8} {kib:6} KiB {row['errors']:8} errors  {row['ms_min']:9.1f} ms min  "
                  f"{row['ms_median']:9.1f} ms median  GIL held up to {row['gil_ms_max']:9.1f} ms", flush=True)
    return rows


def markdown(res: dict[str, Any]) -> str:
    lines = [f"# Refusing an invalid payload, {res['date']}", "",
             f"runner at {res['commit']}; {'every error listed at every size' if res['full'] else 'as shipped'}; "
             f"LIST_BYTES {res['list_bytes']}; {res['rounds']} round(s); load average {res['load']}.", "",
             "| shape | KiB | errors | ms (min) | ms (median) | GIL held, ms (max) |", "|---|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        lines.append(f"| {r['shape']} | {r['kib']} | {r['errors']:,} | {r['ms_min']:.1f} | {r['ms_median']:.1f} | "
                     f"{r['gil_ms_max']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="list every error at every size")
    ap.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8, 16, 32, 1024], help="KiB encoded")
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--src", type=Path, default=BENCH.parent, help="the checkout whose runner/ is measured")
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    sys.path.insert(0, str(a.src.resolve()))
    try:
        from runner.catalog.listing import LIST_BYTES
    except ImportError:  # a checkout from before the limit: every error listed
        LIST_BYTES = None

    commit = subprocess.run(["git", "-C", str(a.src), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    res = {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "commit": commit, "full": a.full,
           "list_bytes": LIST_BYTES, "rounds": a.rounds,
           "load": " ".join(Path("/proc/loadavg").read_text().split()[:3]),
           "rows": measure(a.shapes, a.sizes, a.rounds, a.full)}
    md = markdown(res)
    print(md)
    if not a.no_write:
        RESULTS.mkdir(exist_ok=True)
        name = "validation-full" if a.full else "validation"
        (RESULTS / f"{name}.json").write_text(json.dumps(res, indent=1) + "\n")
        (RESULTS / f"{name}.md").write_text(md)


if __name__ == "__main__":
    main()
