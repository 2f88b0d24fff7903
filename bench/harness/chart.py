"""Draws the results chart (run with the peers' venv, which has matplotlib):

    python chart.py latest.json latest.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main() -> None:
    res = json.loads(Path(sys.argv[1]).read_text())
    systems = res["systems"]
    names = list(systems)
    labels = [systems[n]["label"].split(" (")[0].split(" + ")[0] for n in names]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5.5))
    metrics = [("drain", "drain"), ("enqueue_single", "enqueue, one by one"),
               ("enqueue_batch", "enqueue, batch")]
    h = 0.27
    for i, (key, title) in enumerate(metrics):
        ys = [j + (i - 1) * h for j in range(len(names))]
        med, lo, hi = [], [], []
        for n in names:
            s = systems[n].get(key)
            m = s["median"] if s else 0
            med.append(m)
            lo.append(m - s["min"] if s else 0)
            hi.append(s["max"] - m if s else 0)
        ax1.barh(ys, med, height=h, xerr=[lo, hi], label=title, capsize=2)
    ax1.set_yticks(range(len(names)), labels)
    ax1.invert_yaxis()
    ax1.set_xlabel("jobs/s (median, min-max)")
    ax1.set_title("Throughput, no-op jobs, 2 worker processes")
    ax1.legend(loc="lower right")
    ax1.grid(axis="x", alpha=0.3)
    p50, p99, lat_names = [], [], []
    for n, lab in zip(names, labels, strict=True):
        lat = systems[n].get("latency")
        if lat and not systems[n].get("over_capacity"):
            lat_names.append(lab)
            p50.append(lat["p50_ms"]["median"])
            p99.append(lat["p99_ms"]["median"])
    ys = range(len(lat_names))
    ax2.barh([y - 0.2 for y in ys], p50, height=0.4, label="p50")
    ax2.barh([y + 0.2 for y in ys], p99, height=0.4, label="p99")
    ax2.set_yticks(list(ys), lat_names)
    ax2.invert_yaxis()
    ax2.set_xscale("log")
    ax2.set_xlabel("ms (log scale)")
    ax2.set_title("Enqueue->start latency at 500 jobs/s offered")
    ax2.legend(loc="upper right")
    ax2.grid(axis="x", alpha=0.3)
    m = res["machine"]
    fig.suptitle(f"{res['date'][:10]}: {m['cpus']} cores, {m['redis']}, {res['config']['reps']} repetition(s)")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=80)


if __name__ == "__main__":
    main()
