"""One module handles a script Redis lost: only runner/store/transport.py names redis-py's
NoScriptError or compares an error code with "NOSCRIPT", read off the source with ``ast``
as test_layers.py reads the imports. A second place that reloads scripts would be a
second copy of the transport's rules (a call that ran is never sent twice; a reload cut
off keeps the calls that ran), free to drift from the first.

A table of error codes (link.py's parser) names "NOSCRIPT" without handling it: only a
comparison counts."""

from __future__ import annotations

import ast
from pathlib import Path

import sourcetrees

PACKAGE = Path(__file__).parents[2] / "runner"
SEAM = PACKAGE / "store" / "transport.py"


def _handles_one(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id == "NoScriptError"
    if isinstance(node, ast.Attribute):
        return node.attr == "NoScriptError"
    if isinstance(node, ast.alias):
        return node.name.rsplit(".", 1)[-1] == "NoScriptError"
    if isinstance(node, ast.Compare):
        return any(isinstance(c, ast.Constant) and c.value == "NOSCRIPT" for c in [node.left, *node.comparators])
    return False


def _handles(tree: ast.AST) -> list[int]:
    """The lines that name NoScriptError or compare something with "NOSCRIPT"."""
    return [getattr(node, "lineno", 0) for node in ast.walk(tree) if _handles_one(node)]


def test_only_the_transport_handles_a_lost_script() -> None:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = _handles(sourcetrees.tree(path))
        if lines:
            found[str(path.relative_to(PACKAGE.parent))] = lines
    assert set(found) == {str(SEAM.relative_to(PACKAGE.parent))}, (
        f"NOSCRIPT handled outside runner/store/transport.py: {found}; send the script "
        "through the transport (Transport, LinkScripts, send_on_loop) instead")


def test_the_walk_sees_each_way_of_handling_it() -> None:
    """The walk must not pass for want of seeing: each spelling it looks for is caught."""
    for src in ("try:\n    pass\nexcept NoScriptError:\n    pass\n",
                "isinstance(e, exceptions.NoScriptError)\n",
                "from redis.exceptions import NoScriptError\n",
                "reply.code == 'NOSCRIPT'\n",
                "'NOSCRIPT' != code\n"):
        assert _handles(ast.parse(src)), src
    assert not _handles(ast.parse("CODES = frozenset({'NOSCRIPT', 'ERR'})\n"))
