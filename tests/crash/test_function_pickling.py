"""What a function file defines can be pickled, as plain Python's can: a handler hands a
function of its file to a ProcessPoolExecutor (the usual way to use the cores from a
CPU-bound handler) and pickles a dataclass of its file, under both isolations. Before,
both failed: the file's module was in sys.modules as ``runner_functions.<name>`` but its
parent package was not, so pickle could not import it by name."""

from __future__ import annotations

import pytest
from crashkit import wait_final

from conftest import Project

POOLED = '''
import dataclasses
import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor

QUEUE = "fast"
ISOLATION = "{isolation}"
MAX_ATTEMPTS = 1


@dataclasses.dataclass
class Point:
    x: int


def square(i):
    return i * i


def handle(payload, ctx):
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
        total = sum(pool.map(square, range(10)))
    back = pickle.loads(pickle.dumps(Point(3)))
    return {{"sum": total, "point": back.x, "same": type(back) is Point}}
'''


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_handler_hands_its_files_function_to_a_process_pool(project: Project, isolation: str) -> None:
    project.add_function("pooled", POOLED.format(isolation=isolation))
    project.write_config(vt=5, concurrency=1, prefetch=0, max_attempts=1)
    job = project.client.enqueue("pooled", {}).id
    project.spawn_worker("fast")
    final = wait_final(project, [job], timeout=60)[job]
    assert final["status"] == "done", final.get("last_error")
    assert final["result"] == {"sum": 285, "point": 3, "same": True}
