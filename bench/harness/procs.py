"""Worker processes: start them in their own process group, read their CPU time and
memory from /proc (the whole tree: some systems fork their workers), stop them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces: split after its closing parenthesis.
    return raw[raw.rfind(")") + 2:].split()


def children_map() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        f = _stat(int(d))
        if f is not None:
            out.setdefault(int(f[1]), []).append(int(d))
    return out


def tree(roots: Sequence[int]) -> list[int]:
    kids = children_map()
    seen: list[int] = []
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.append(pid)
        todo.extend(kids.get(pid, []))
    return seen


def cpu_s(pids: Sequence[int]) -> float:
    """User + system CPU seconds of these processes (live ones only)."""
    total = 0
    for pid in pids:
        f = _stat(pid)
        if f is not None:
            total += int(f[11]) + int(f[12])
    return total / CLK_TCK


def rss_bytes(pid: int) -> int:
    f = _stat(pid)
    return int(f[21]) * PAGE if f is not None else 0


@dataclass
class Group:
    """Processes started together (e.g. the 2 workers of one system)."""

    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, cmds: Sequence[Sequence[str]], env: dict[str, str], cwd: str, log: Path) -> Group:
        for i, cmd in enumerate(cmds):
            out = open(log.with_suffix(f".{i}.log"), "ab")  # noqa: SIM115 - kept by the child
            self.procs.append(subprocess.Popen(
                list(cmd), env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            ))
            out.close()
        return self

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def all_pids(self) -> list[int]:
        return tree(self.pids)

    def cpu_s(self) -> float:
        return cpu_s(self.all_pids())

    def max_rss_mb(self) -> float:
        """The largest resident set of any process of the group that runs jobs."""
        return max((rss_bytes(p) for p in self.all_pids()), default=0) / 2**20

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def stop(self, grace_s: float = 3.0) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.05, deadline - time.monotonic()))
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
        self.procs = []
