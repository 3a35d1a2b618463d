"""The process's allocator settings for CPU runs (fedrun.device.keep_freed_memory): freed blocks of a
few MB are reused instead of being handed back to the system and faulted in again."""
import os
import subprocess
import sys

import pytest

from fedrun.device import keep_freed_memory

CYCLES = """
import resource, sys, torch
from fedrun.device import keep_freed_memory
print(keep_freed_memory())
def cycle():  # what a round's full passes do: blocks of a few MB allocated, touched, freed
    ts = [torch.ones((7 << 20) // 4) for _ in range(3)]
    del ts
big = torch.ones((8 << 20) // 4)
del big
cycle()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    cycle()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
"""
PAGES = 5 * 3 * (7 << 20) // 4096  # pages the 5 timed cycles touch


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator: Linux only")
def test_freed_blocks_are_reused_without_page_faults():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", CYCLES], capture_output=True, text=True, env=env, check=True)
    took, faults = out.stdout.split()
    assert took == "True"
    # glibc's defaults fault in nearly every page again (measured: 26,720 of 26,880), kept: ~7%
    assert int(faults) < PAGES // 4, (faults, PAGES)


@pytest.mark.parametrize("var, value", [("MALLOC_ARENA_MAX", "2"), ("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=0")])
def test_the_users_own_glibc_tunables_are_left_alone(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    assert keep_freed_memory() is False


def test_a_run_keeps_freed_memory(tmp_path, monkeypatch):
    import fedrun.runner as runner
    from helpers import fedrun as run_cli

    calls = []
    monkeypatch.setattr(runner, "keep_freed_memory", lambda: calls.append(1))
    r = run_cli(["data.num_clients=6", "data.seed=9", "rounds=1", "tau=1", "clients_per_round=2", "progress=false",
                f"hydra.run.dir={tmp_path / 'o'}"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert calls == [1]
