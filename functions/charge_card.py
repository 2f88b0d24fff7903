"""Charge a card at a pretend payment provider: the example of a retry and of a
permanent failure.

The provider is simulated with the card numbers payment providers hand out for tests,
so no network is needed:

    4242424242424242   charged at once
    4000000000000119   the provider is busy (its HTTP 429) for the first two attempts:
                       `raise Retry(delay=...)` tries again after the delay it asked for,
                       and the third attempt goes through
    4000000000000002   declined: `raise PermanentFailure(...)` sends the job straight to
                       the dead-letter list, with no more attempts (retrying cannot help)

Any other exception (a timeout, a bug) is transient: retried with the queue's backoff
until MAX_ATTEMPTS, then dead-lettered with its last error. Try it with `runner dev`
running: `runner enqueue charge_card '{"order_id": "o-2", "amount_cents": 990,
"card": "4000000000000002"}'`, then `runner dead ls`.

The charge is keyed by the order (IDEMPOTENCY_KEY): enqueueing the same order twice
returns the first job, and a real provider gets the key as its idempotency key, so a
run repeated after a crash never charges twice.
"""

from __future__ import annotations

import hashlib

from runner import Context, PermanentFailure, Retry

QUEUE = "fast"
MAX_ATTEMPTS = 4
TIMEOUT = 10
IDEMPOTENCY_KEY = "charge:{order_id}"

DECLINED = "4000000000000002"
BUSY = "4000000000000119"
BUSY_ATTEMPTS = 2        # how many attempts the pretend provider turns away
RETRY_AFTER_S = 1.0      # the delay it asks for (a real one sends Retry-After)


def handle(payload: dict, ctx: Context) -> dict:
    card = payload["card"]
    if card == DECLINED:
        raise PermanentFailure(f"card ending {card[-4:]} was declined (do_not_honor)")
    if card == BUSY and ctx.attempt <= BUSY_ATTEMPTS:
        ctx.logger.info("provider busy on attempt %d, retrying in %gs", ctx.attempt, RETRY_AFTER_S)
        raise Retry(delay=RETRY_AFTER_S, reason="provider busy (429)")
    key = ctx.idempotency_key or ctx.job_id
    charge_id = "ch_" + hashlib.sha256(key.encode()).hexdigest()[:16]
    ctx.logger.info("charged %d cents to card ending %s", payload["amount_cents"], card[-4:])
    return {"charge_id": charge_id, "amount_cents": payload["amount_cents"], "attempt": ctx.attempt}
