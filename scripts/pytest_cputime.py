"""pytest plugin: each test's CPU seconds (this process and the children it waited for) next to its
wall seconds. On a shared machine the wall times of `--durations` grow with the other processes' load;
the CPU seconds do not (docs/suite_durations.md):

    PYTHONPATH=$PWD:$PWD/scripts CPUTIME_OUT=/tmp/cpu.txt \\
        python -m pytest -q -n 0 -p no:cacheprovider -p pytest_cputime tests/test_scripts.py
"""
from __future__ import annotations

import os
import time

import pytest

_rows: list[tuple[float, float, str]] = []


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    c0, w0 = _cpu(), time.perf_counter()
    yield
    _rows.append((_cpu() - c0, time.perf_counter() - w0, item.nodeid))


def pytest_sessionfinish(session):
    out = os.environ.get("CPUTIME_OUT")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if out and worker:                      # under xdist: one file per worker, e.g. /tmp/cpu.txt.gw0
        out = f"{out}.{worker}"
    if out and _rows:
        with open(out, "w") as f:
            for cpu, wall, name in sorted(_rows, reverse=True):
                f.write(f"{cpu:8.2f} cpu {wall:8.2f} wall  {name}\n")
            f.write(f"{sum(r[0] for r in _rows):8.2f} cpu total, {len(_rows)} tests\n")
