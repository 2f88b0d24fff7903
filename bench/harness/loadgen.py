"""A bounded, open-loop HTTP load generator (standard library only):

    python loadgen.py HOST PORT PATH --rate R --seconds S [--token T] [--connections C]

Sends POST PATH with a small JSON body at R requests/s for S seconds over up to C
keep-alive connections (reconnecting when the server closes one). Latency runs from the
moment a request was due, not from when a connection was free, so a slow server cannot
hide its queueing (no coordinated omission). Prints one JSON line: sent, ok, errors,
statuses, achieved rate, p50/p99/max ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any


class Conn:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, raw: bytes) -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        self.writer.write(raw)
        status_line = await self.reader.readline()
        if not status_line:
            self.close()
            raise ConnectionError("closed by the server")
        status = int(status_line.split()[1])
        length, close = 0, False
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "connection" and value.strip().lower() == "close":
                close = True
        if length:
            await self.reader.readexactly(length)
        if close:
            self.close()
        return status

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def run(a: argparse.Namespace) -> dict[str, Any]:
    body = b'{"t": 0}'
    auth = f"Authorization: Bearer {a.token}\r\n" if a.token else ""
    raw = (f"POST {a.path} HTTP/1.1\r\nHost: {a.host}\r\nContent-Type: application/json\r\n"
           f"{auth}Content-Length: {len(body)}\r\n\r\n").encode() + body
    pool: asyncio.Queue[Conn] = asyncio.Queue()
    for _ in range(a.connections):
        pool.put_nowait(Conn(a.host, a.port))
    lat: list[float] = []
    statuses: dict[int, int] = {}
    errors = 0

    async def one(due: float) -> None:
        nonlocal errors
        conn = await pool.get()
        try:
            status = await asyncio.wait_for(conn.request(raw), 10)
            statuses[status] = statuses.get(status, 0) + 1
            lat.append(time.perf_counter() - due)
        except (TimeoutError, OSError, ConnectionError, ValueError, IndexError):
            errors += 1
            conn.close()
        finally:
            pool.put_nowait(conn)

    n = int(a.rate * a.seconds)
    start = time.perf_counter()
    tasks = []
    for i in range(n):
        due = start + i / a.rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(due)))
    await asyncio.wait(tasks, timeout=30)
    elapsed = time.perf_counter() - start
    s = sorted(x * 1000 for x in lat)

    def q(p: float) -> float:
        return s[min(len(s) - 1, int(p * len(s)))] if s else float("nan")

    return {"sent": n, "ok": statuses.get(202, 0), "statuses": statuses, "errors": errors,
            "rate": a.rate, "achieved": len(lat) / elapsed, "p50_ms": q(0.5), "p99_ms": q(0.99),
            "max_ms": s[-1] if s else float("nan")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("path")
    ap.add_argument("--rate", type=float, required=True)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--token", default="")
    ap.add_argument("--connections", type=int, default=64)
    a = ap.parse_args()
    a.seconds = min(a.seconds, 60.0)
    print(json.dumps(asyncio.run(run(a))))


if __name__ == "__main__":
    main()
