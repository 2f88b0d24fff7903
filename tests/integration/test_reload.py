"""Hot reload keeps only what it should: a reload leaves no module behind, a helper module
shared by functions is reloaded when it is edited, and a file whose loading blows up in
an unexpected way keeps its function's last good version."""

from __future__ import annotations

import json
import sys

from test_dev import HELLO_SCHEMA, Dev, examples  # noqa: F401  (the fixture)

from runner.catalog import registry

from conftest import Project, wait_for

SHARED = '''"""Not a function: a helper the greeters share."""
WORD = "hello"
'''
GREETER = '''"""Greets with the shared word."""
from _shared import WORD

QUEUE = "fast"


def handle(payload, ctx):
    return {"greeting": WORD + " " + payload["name"], "by": ctx.type}
'''


def test_reloading_leaves_no_module_behind(examples: Project) -> None:  # noqa: F811
    """Loading the functions again and again keeps one module per function in sys.modules."""
    cfg = examples.config()
    reg = registry.load(cfg)
    before = set(sys.modules)
    for _ in range(20):
        reg = registry.load(cfg, previous=reg)
    grown = set(sys.modules) - before
    assert not grown, f"20 reloads left {len(grown)} more modules: {sorted(grown)[:5]}"


def test_a_shared_helper_module_is_reloaded_when_edited(examples: Project) -> None:  # noqa: F811
    """Two functions import functions/_shared.py; editing it changes both at the next job."""
    fns = examples.root / "functions"
    (fns / "_shared.py").write_text(SHARED)
    for name in ("greet_a", "greet_b"):
        (fns / f"{name}.py").write_text(GREETER)
        (examples.root / "schemas" / name).mkdir()
        (examples.root / "schemas" / name / "v1.json").write_text(json.dumps(HELLO_SCHEMA))
    dev = Dev(examples.root, examples.env)
    try:
        assert dev.run("greet_a", {"name": "Ada"})["result"]["greeting"] == "hello Ada"
        (fns / "_shared.py").write_text(SHARED.replace('"hello"', '"howdy"'))
        for name in ("greet_a", "greet_b"):
            wait_for(lambda n=name: dev.run(n, {"name": "Ada"})["result"]["greeting"] == "howdy Ada",
                     timeout=15, interval=0.2, what=f"{name} to use the edited helper")
    finally:
        dev.stop()


def test_an_unexpected_error_while_loading_keeps_the_last_good_version(examples: Project) -> None:  # noqa: F811
    """A save that makes loading fail in a way no check expects (handle = a builtin whose
    signature cannot be read) is reported, and the function keeps serving its last good code."""
    fns = examples.root / "functions"
    (fns / "greet_a.py").write_text(GREETER.replace("from _shared import WORD", 'WORD = "hi"'))
    (examples.root / "schemas" / "greet_a").mkdir()
    (examples.root / "schemas" / "greet_a" / "v1.json").write_text(json.dumps(HELLO_SCHEMA))
    dev = Dev(examples.root, examples.env)
    try:
        assert dev.run("greet_a", {"name": "Ada"})["result"]["greeting"] == "hi Ada"
        (fns / "greet_a.py").write_text('"""Broken oddly."""\nQUEUE = "fast"\nhandle = max\n')
        wait_for(lambda: "greet_a.py" in dev.log().split("reloaded in")[-1], timeout=15,
                 what="the reload to report the file")
        assert dev.run("greet_a", {"name": "Ada"})["result"]["greeting"] == "hi Ada"
    finally:
        dev.stop()
