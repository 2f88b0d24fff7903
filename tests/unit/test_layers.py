"""The layers of runner/ hold: each sub-package imports only what its __init__
docstring allows, read off the source with ``ast`` (imports inside functions count
too, since a lazy import is still a dependency)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import sourcetrees

PACKAGE = Path(__file__).parents[2] / "runner"

# Sub-package -> the runner modules and packages it must never import.
FORBIDDEN = {
    "store": ("runner.catalog", "runner.worker", "runner.web", "runner.cli", "runner.dev", "runner.client",
              "runner.runtime", "runner.observe"),
    "catalog": ("runner.store", "runner.worker", "runner.web", "runner.cli", "runner.dev", "runner.client",
                "runner.runtime", "runner.observe"),
    "observe": ("runner.catalog", "runner.worker", "runner.web", "runner.cli", "runner.dev", "runner.client",
                "runner.runtime"),
    "client": ("runner.worker", "runner.web", "runner.cli", "runner.dev", "runner.testing", "runner.contrib"),
    "worker": ("runner.web", "runner.cli", "runner.dev"),
    "web": ("runner.worker", "runner.cli", "runner.dev"),
    "dev": ("runner.cli",),
}


def imported(path: Path) -> set[str]:
    """Every runner module a file imports, as dotted names (``from runner import x``
    counts as runner.x, so a sibling module is caught whichever form is used)."""
    out: set[str] = set()
    for node in ast.walk(sourcetrees.tree(path)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return {m for m in out if m == "runner" or m.startswith("runner.")}


def _breaks(module: str, banned: tuple[str, ...]) -> bool:
    return any(module == b or module.startswith(b + ".") for b in banned)


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_a_layer_imports_nothing_above_it(layer: str) -> None:
    files = sorted((PACKAGE / layer).rglob("*.py"))
    assert files, f"runner/{layer}/ holds no module"
    wrong = {str(f.relative_to(PACKAGE.parent)): sorted(m for m in imported(f) if _breaks(m, FORBIDDEN[layer]))
             for f in files}
    assert {f: ms for f, ms in wrong.items() if ms} == {}


def test_every_sub_package_says_what_it_may_import() -> None:
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(sourcetrees.tree(init)) or ""
        assert "import" in doc.lower(), f"{init.parent.name}/__init__.py does not say what it may import"


def test_the_walk_sees_a_violation(tmp_path: Path) -> None:
    """The check itself can fail: a lazy import of the worker inside a function is found."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from runner.worker.worker import Worker\n    from runner import cli\n")
    assert {"runner.worker.worker", "runner.cli"} <= imported(bad)
    assert _breaks("runner.worker.worker", FORBIDDEN["store"])
