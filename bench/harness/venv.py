"""The peers' virtual environment (bench/.venv-peers), created on first use and
reinstalled when the requirement files change. A peer that will not install is skipped
with a message; the others still run."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from harness.systems import BENCH

VENV = BENCH / ".venv-peers"
REQS = BENCH / "requirements-peers.txt"
NODEPS = BENCH / "requirements-peers-nodeps.txt"


def _lines(p: Path) -> list[str]:
    return [ln.split("#")[0].strip() for ln in p.read_text().splitlines() if ln.split("#")[0].strip()]


def _pip(py: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
                          capture_output=True, text=True)


def ensure(venv: Path = VENV) -> Path:
    """The python of the peers' venv, installed as the requirement files say."""
    py = venv / "bin" / "python"
    stamp = venv / ".requirements.sha1"
    digest = hashlib.sha1(REQS.read_bytes() + NODEPS.read_bytes()).hexdigest()
    if py.exists() and stamp.exists() and stamp.read_text() == digest:
        return py
    print(f"installing the peers into {venv.relative_to(BENCH.parent)} ...", flush=True)
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    if _pip(py, "-r", str(REQS)).returncode != 0:
        # One at a time, so one broken peer does not take the others down with it.
        for req in _lines(REQS):
            proc = _pip(py, req)
            if proc.returncode != 0:
                print(f"  skip {req}: {proc.stderr.strip().splitlines()[-1:]}", flush=True)
    for req in _lines(NODEPS):
        proc = _pip(py, "--no-deps", req)
        if proc.returncode != 0:
            print(f"  skip {req}: {proc.stderr.strip().splitlines()[-1:]}", flush=True)
    stamp.write_text(digest)
    return py


def ensure_wrk() -> str | None:
    """wrk, the HTTP load generator (a Debian package): installed when missing and this
    process may (root with apt-get); else None and the Python generator stands in."""
    import os
    import shutil

    found = shutil.which("wrk")
    if found or os.geteuid() != 0 or not shutil.which("apt-get"):
        return found
    print("installing wrk (apt-get) ...", flush=True)
    subprocess.run(["apt-get", "install", "-y", "-q", "wrk"], capture_output=True, timeout=600)
    return shutil.which("wrk")
