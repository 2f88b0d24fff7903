"""The package's source files, read and parsed once per test process.

Several unit tests walk the syntax tree of every module of runner/ (the store's
ownership of Redis, the one transport, the layers, the client's shape, inline scripts);
each parsed the whole package afresh, about 0.6 s of CPU a walk. A file's text is kept by
its path, modification time and size (a file edited during the run is read again), and
its tree by that text. The trees are shared: a test reads them and never changes one.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path


@functools.cache
def _read(path: str, mtime_ns: int, size: int) -> str:
    return Path(path).read_text(encoding="utf-8")


def text(path: Path) -> str:
    """The file's text, read once while it is unchanged."""
    st = path.stat()
    return _read(str(path.resolve()), st.st_mtime_ns, st.st_size)


@functools.cache
def parse(source: str) -> ast.Module:
    """The tree of this text, parsed once: the same object for every test that asks."""
    return ast.parse(source)


def tree(path: Path) -> ast.Module:
    """The file's tree, parsed once while it is unchanged."""
    return parse(text(path))
