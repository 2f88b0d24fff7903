"""Schemas that passed the metaschema check and compiled, remembered across processes by
content in ``.runner/schemas.json`` beside runner.toml.

A process whose schemas are unchanged since the last load then skips the metaschema
check (importing jsonschema was the largest part of a worker's start) and compiles each
validator when it is first used. Any schema not found here, a new or edited file, is
checked and compiled at load as before, so a broken schema is still reported at load.

An entry is keyed by the SHA-256 of the file's path and text and holds the warnings its
load gave. The file holds the entries of one set of versions: runner's, the code that
checks (schemas.py, keywords.py), and the installed copies of jsonschema and jsonschema-rs; any change
and it starts empty.
It is only a shortcut: missing, damaged, unreadable or unwritable, it is ignored.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import threading
from collections.abc import Sequence
from pathlib import Path

import orjson

from runner.config import STATE_DIR, Config, state_dir

# 2: a backtracking pattern is a warning (schemas.py reads it back); 3: so is a backtracking
# patternProperties key, and a schema matching one unbounded is refused.
FORMAT = 3
FILE = "schemas.json"


def key(path: Path, text: str) -> str:
    return hashlib.sha256(f"{path}\0{text}".encode("utf-8", "surrogatepass")).hexdigest()


def _installed(module: str) -> str:
    """Which copy of a top-level module is installed, found without importing it: the
    version in the name of its distribution's metadata folder beside it, and its file's
    size and modification time. importlib.metadata would say the version too, but costs a
    command that loads functions more than reading this whole file does."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ValueError(f"{module} is not installed")
    st = os.stat(spec.origin)
    site = Path(spec.origin).parent.parent
    dists = sorted(e.name for e in os.scandir(site)
                   if e.name.endswith(".dist-info") and e.name.split("-", 1)[0].lower() == module.lower())
    return f"{module} {' '.join(dists)} {spec.origin} {st.st_size} {st.st_mtime_ns}"


def _versions() -> list[str] | None:
    """What a check's outcome depends on besides the schema; None when it cannot be told."""
    from runner import __version__
    from runner.catalog import keywords, schemas

    try:
        code = hashlib.sha256(b"".join(Path(str(m.__file__)).read_bytes() for m in (schemas, keywords))).hexdigest()
        return [__version__, code, _installed("jsonschema"), _installed("jsonschema_rs")]
    except (OSError, ValueError, ImportError):
        return None


class Checked:
    """The entries read at the start of one registry load, and those it vouches for."""

    def __init__(self, file: Path | None, versions: list[str] | None, known: dict[str, list[str]]) -> None:
        self.file = file
        self.versions = versions
        self.known = known
        self.seen: dict[str, list[str]] = {}

    @classmethod
    def open(cls, config: Config) -> Checked:
        file = config.root / STATE_DIR / FILE
        versions = _versions()
        known: dict[str, list[str]] = {}
        if versions is not None:
            with contextlib.suppress(OSError, orjson.JSONDecodeError):
                data = orjson.loads(file.read_bytes())
                if isinstance(data, dict) and data.get("format") == FORMAT and data.get("versions") == versions \
                        and isinstance(data.get("schemas"), dict):
                    known = {k: v for k, v in data["schemas"].items()
                             if isinstance(v, list) and all(isinstance(w, str) for w in v)}
        return cls(file if versions is not None else None, versions, known)

    def vouched(self, path: Path, text: str) -> tuple[str, ...] | None:
        """The warnings of this schema file when this very text passed before, else None."""
        k = key(path, text)
        found = self.known.get(k)
        if found is not None:
            self.seen[k] = found
            return tuple(found)
        return None

    def passed(self, path: Path, text: str, warnings: Sequence[str]) -> None:
        self.seen[key(path, text)] = list(warnings)

    def save(self) -> None:
        """Keep this load's entries (and only them) for the next process; a no-op when they
        are the ones read."""
        if self.file is None or self.seen == self.known:
            return
        body = orjson.dumps({"format": FORMAT, "versions": self.versions, "schemas": self.seen})
        # A name of this thread's own: registries load in several threads and processes.
        tmp = self.file.with_name(f"{FILE}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            state_dir(self.file.parent.parent)  # .runner/, git-ignored
            tmp.write_bytes(body)
            os.replace(tmp, self.file)  # whole or not at all, for a process reading it now
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
