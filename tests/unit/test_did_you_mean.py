"""The did-you-mean of every unknown name: a close misspelling is found, an unrelated name
of another length never is."""

from __future__ import annotations

import pytest

from runner.errors import likely


@pytest.mark.parametrize(
    ("typed", "known", "meant"),
    [
        ("fv", ["vf"], "vf"),
        ("fsat", ["fast", "slow"], "fast"),
        ("send_emial", ["send_email", "charge_card"], "send_email"),
        ("send_emails", ["send_email"], "send_email"),
    ],
)
def test_a_close_misspelling_is_found(typed: str, known: list[str], meant: str) -> None:
    """One edit per four letters, a swap of two neighbours counting as one."""
    assert likely(typed, known) == meant


@pytest.mark.parametrize(
    ("typed", "known"),
    [
        ("send_welcome_email", ["vf"]),
        ("generate_monthly_report", ["vf", "fast"]),
        ("resize_image_thumbnail", ["a", "zz"]),
        ("background_emails_queue", ["fast", "slow"]),
        ("zzzzzzzzzzzz", ["vf"]),
    ],
)
def test_a_long_name_is_never_matched_to_an_unrelated_short_one(typed: str, known: list[str]) -> None:
    """A length gap beyond the allowed edits is no match (it once read as three edits for any gap)."""
    assert likely(typed, known) is None



def test_a_name_far_longer_than_any_known_one_costs_no_comparison(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 4,000-letter name against 100 functions is never compared letter by letter (that
    once took seconds of a web worker): the length gap alone rules each one out."""
    import runner.errors

    calls: list[str] = []
    real = runner.errors._edits
    monkeypatch.setattr(runner.errors, "_edits", lambda a, b: calls.append(b) or real(a, b))
    known = [f"function_{i:03d}" for i in range(100)]
    for typed in ("x" * 4000, "y" * 90):
        assert likely(typed, known) is None
    assert calls == []
