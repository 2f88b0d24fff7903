"""Send a transactional email.

Through SMTP when SMTP_URL is set (smtp://user:pass@host:port); otherwise the message
is written to the outbox folder (OUTBOX_DIR, default ./outbox), one JSON file per email,
so development and tests need no mail server.

The pattern to copy: the effect (the email) is keyed by the job's idempotency key, so a
second run of the same job after a crash overwrites one outbox file instead of sending
twice; a real mail provider gets the same key as its own idempotency header.
"""

from __future__ import annotations

import json
import os
import smtplib
from email.message import EmailMessage
from pathlib import Path
from urllib.parse import urlparse

from runner import Context, PermanentFailure

QUEUE = "fast"
MAX_ATTEMPTS = 5
TIMEOUT = 20
IDEMPOTENCY_KEY = "{user_id}:{template}"
RESOURCE_KEY = "user:{user_id}"

TEMPLATES = {
    "welcome": "Welcome aboard, {name}!",
    "reset": "Hello {name}, here is your password reset link.",
    "receipt": "Thanks for your order, {name}.",
}


def upgrade(payload: dict, from_version: int) -> dict:
    """v1 had a single "to" address and no name; v2 has "to": [..] and "name"."""
    if from_version == 1:
        out = dict(payload)
        out["to"] = [payload["to"]]
        out["name"] = payload.get("name") or payload["to"].split("@")[0]
        return out
    raise ValueError(f"no upgrade from v{from_version}")


def handle(payload: dict, ctx: Context) -> dict:
    template = TEMPLATES.get(payload["template"])
    if template is None:
        raise PermanentFailure(f"unknown template {payload['template']!r}")
    body = template.format(name=payload["name"])
    key = ctx.idempotency_key or ctx.job_id
    smtp_url = os.environ.get("SMTP_URL")
    if smtp_url:
        url = urlparse(smtp_url)
        msg = EmailMessage()
        msg["From"] = os.environ.get("SMTP_FROM", "runner@localhost")
        msg["To"] = ", ".join(payload["to"])
        msg["Subject"] = payload["template"]
        msg["X-Idempotency-Key"] = key
        msg.set_content(body)
        with smtplib.SMTP(url.hostname or "localhost", url.port or 25, timeout=ctx.remaining_s) as s:
            if url.username:
                s.login(url.username, url.password or "")
            s.send_message(msg)
        sent_via = "smtp"
    else:
        outbox = Path(os.environ.get("OUTBOX_DIR", "outbox"))
        outbox.mkdir(parents=True, exist_ok=True)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in key)
        # Write then rename: a crash never leaves half a message, a rerun overwrites.
        tmp = outbox / f".{safe}.tmp"
        tmp.write_text(json.dumps({"to": payload["to"], "body": body, "job_id": ctx.job_id,
                                   "attempt": ctx.attempt}))
        tmp.replace(outbox / f"{safe}.json")
        sent_via = "outbox"
    ctx.logger.info("sent %s to %d recipient(s) via %s", payload["template"], len(payload["to"]), sent_via)
    return {"sent_to": payload["to"], "via": sent_via}
