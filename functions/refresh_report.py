"""Rebuild a report: a long job that works in chunks.

It saves a checkpoint after every chunk, so a run that was interrupted (worker killed,
deploy) resumes where the last one stopped instead of starting over, and it extends
its lease as it goes. The report is written to REPORTS_DIR (default ./reports) with a
write-then-rename, so readers never see half a report.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from runner import Context

QUEUE = "slow"
MAX_ATTEMPTS = 3
TIMEOUT = 600
RESOURCE_KEY = "report:{report_id}"


def handle(payload: dict, ctx: Context) -> dict:
    chunks = payload.get("chunks", 10)
    pause = payload.get("chunk_seconds", 0.05)
    state = ctx.checkpoint or {"done": 0, "digest": ""}
    if state["done"]:
        ctx.logger.info("resuming report %s at chunk %d", payload["report_id"], state["done"])
    for i in range(state["done"], chunks):
        time.sleep(pause)  # stands in for a slow query over one chunk
        digest = hashlib.sha256(f"{state['digest']}:{payload['report_id']}:{i}".encode()).hexdigest()
        state = {"done": i + 1, "digest": digest}
        ctx.save_checkpoint(state)
        ctx.extend_lease()
    out_dir = Path(os.environ.get("REPORTS_DIR", "reports"))
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{payload['report_id']}.tmp"
    tmp.write_text(json.dumps({"report_id": payload["report_id"], "chunks": chunks,
                               "digest": state["digest"]}))
    tmp.replace(out_dir / f"{payload['report_id']}.json")
    return {"report_id": payload["report_id"], "chunks": chunks, "digest": state["digest"]}
