"""The folder of this file is put on sys.path, so every test file, in any subfolder, imports the
shared helpers with `from helpers import ...`."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist runs one worker per core (pyproject: -n auto): one torch thread each, so the
    # workers don't fight over the cores.
    import torch

    torch.set_num_threads(1)

# The modules of the longest tests (the paper scripts' --quick runs, 12-50 s each; every algorithm's
# torch.compile capture, 1-45 s), run first: pytest-xdist's worksteal hands each worker a contiguous
# share of the collection and lets an idle one take the back half of the other's, so a long test
# collected last (tests/test_scripts.py sorts near the end) ran alone at the end of the suite while
# the other worker had nothing left. Longest first, the suite ends on short tests. Order only.
FIRST = ("test_scripts.py", "test_acceleration.py")


def pytest_collection_modifyitems(items):
    first = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: first.get(item.path.name, len(FIRST)))  # stable: the rest keep their order
