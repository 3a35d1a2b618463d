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
