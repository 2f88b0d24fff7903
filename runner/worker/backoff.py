"""Retry delays: exponential backoff with jitter (full, equal or none)."""

from __future__ import annotations

import random

from runner.config import Backoff


def delay_s(policy: Backoff, attempt: int, rnd: random.Random | None = None) -> float:
    """The wait before attempt ``attempt + 1`` after ``attempt`` failed (attempt >= 1)."""
    r: float = (rnd or random).random()
    ceiling = float(min(policy.cap_s, policy.base_s * (2 ** min(max(attempt - 1, 0), 32))))
    if policy.jitter == "full":
        return ceiling * r
    if policy.jitter == "equal":
        return ceiling / 2 + ceiling / 2 * r
    return ceiling
