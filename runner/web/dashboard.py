"""The dashboard's static shell: GET / and /static/<file>. Plain HTML, JS and CSS from
the package, no build step and no third-party script. The shell holds no data, so it is
served without the token; its script asks for the token and sends it to the API."""

from __future__ import annotations

from importlib import resources

import falcon
import falcon.asgi

from runner.web.problems import Problem

_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
# The page renders data from jobs (payloads, errors): no inline script, no other origin.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


class Static:
    def __init__(self) -> None:
        folder = resources.files("runner.web").joinpath("static")
        self.files = {p.name: p.read_bytes() for p in folder.iterdir()
                      if p.is_file() and "." + p.name.rsplit(".", 1)[-1] in _TYPES}

    def _send(self, resp: falcon.Response, name: str) -> None:
        data = self.files.get(name)
        if data is None:
            raise Problem(404, "not-found", f"no static file {name!r}")
        resp.data = data
        resp.content_type = _TYPES["." + name.rsplit(".", 1)[-1]]
        # Small files, changed by deploys: revalidate rather than serve a stale script.
        resp.cache_control = ["no-cache"]
        resp.set_header("Content-Security-Policy", CSP)

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        self._send(resp, "index.html")

    async def on_get_file(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, name: str) -> None:
        self._send(resp, name)
