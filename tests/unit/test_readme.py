"""The front door as the README states it: two quickstart commands that make and use a
virtual environment (a system Python may refuse global installs), the second the test
command docs/contributing.md gives, the distribution's own name wherever a `pip install`
fetches runner from the index, CI running the README's test command as written, and skip
messages that say what to install."""

from __future__ import annotations

import ast
import re
import tomllib

from conftest import REPO

README = (REPO / "README.md").read_text()
CONTRIBUTING = (REPO / "docs" / "contributing.md").read_text()
VENV = "python3 -m venv .venv && . .venv/bin/activate && "


def _commands(text: str, section: str) -> list[str]:
    """The indented one-line commands of a section of a page, in order."""
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return [line.strip() for line in body.splitlines() if line.startswith("    ") and line.strip()]


def test_the_quickstart_is_two_commands_each_in_a_venv() -> None:
    """Each command makes .venv (if missing) and activates it before pip, so neither
    meets externally-managed-environment; the first serves, the second tests."""
    first, second = _commands(README, "Quickstart")[:2]
    assert first == VENV + "pip install -e . && runner dev"
    assert second.startswith(VENV + "pip install -e '.[test]' && python3 -m pytest")
    assert _commands(CONTRIBUTING, "Tests")[0] == second


def test_ci_runs_the_readme_test_command_as_written() -> None:
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert _commands(README, "Quickstart")[1] in ci
    assert _commands(CONTRIBUTING, "Tests")[0] in ci


def test_the_system_packages_listed_are_the_ones_ci_installs() -> None:
    """docs/contributing.md's apt-get line (Debian's) is what .ci/run installs for the whole
    run (besides python3-venv, which the quickstart's own note covers); Ubuntu's is the
    same but for its names of the browser and its driver."""
    ci = (REPO / ".ci" / "run").read_text()
    m = re.search(r"apt-get install -y -qq --no-install-recommends ([^>]*)>", ci.replace("\\\n", " "))
    assert m is not None
    installed = set(m.group(1).split()) - {"python3-venv"}
    listed = [c for c in _commands(CONTRIBUTING, "Tests") if c.startswith("sudo apt-get install ")]
    assert len(listed) == 2 and set(listed[0].split()[3:]) == installed
    ubuntu = installed - {"chromium", "chromium-driver"} | {"chromium-browser", "chromium-chromedriver"}
    assert set(listed[1].split()[3:]) == ubuntu


def test_installs_from_the_index_name_the_distribution() -> None:
    """`runner` on PyPI is another package: every `pip install` of runner from the index,
    in the README and docs/, names the distribution pyproject.toml declares."""
    name = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["name"]
    assert name == "runner-redis"
    texts = {"README.md": README} | {f"docs/{p.name}": p.read_text() for p in (REPO / "docs").glob("*.md")}
    bare = re.compile(r"pip3? install (-U |--upgrade )?['\"]?runner(\[[a-z,]+\])?['\"]?(\s|`|$)")
    for where, text in texts.items():
        assert not bare.search(text), f"{where}: {bare.search(text)}"
    assert f"pip install {name}" in README and f"pip install '{name}[otel]'" in README


def test_every_skip_for_a_missing_program_says_what_to_install() -> None:
    """A skip because something is not installed names how to install it."""
    found = 0
    for path in (REPO / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "skip" and node.args):
                continue
            msg = "".join(c.value for c in ast.walk(node.args[0])
                          if isinstance(c, ast.Constant) and isinstance(c.value, str))
            if "not installed" in msg or msg.startswith("needs"):
                found += 1
                assert "install" in msg.replace("not installed", ""), f"{path.name}: {msg!r}"
    assert found >= 8
