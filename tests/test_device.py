"""The process's allocator settings for CPU runs (fedrun.device.keep_freed_memory): freed blocks of a
few MB are reused instead of being handed back to the system and faulted in again."""
import os
import platform
import subprocess
import sys

import pytest

from fedrun.device import keep_freed_memory

# A round's pattern through glibc's malloc itself (torch's CPU tensors come from the same heap):
# blocks of a few MB allocated, written and freed, after one larger block was freed (which is what
# raises glibc's default thresholds to the blocks' size). Prints the minor page faults of 5 cycles.
CYCLES = """
import ctypes, resource, sys
if sys.argv[1] == "1":
    import types
    # fedrun.device's keep_freed_memory is ctypes and os only: a stand-in for torch (its module reads the
    # thread count) saves torch's ~3 s import, whose own allocations would also be in the heap measured
    sys.modules["torch"] = types.SimpleNamespace(get_num_threads=lambda: 1)
    from fedrun.device import keep_freed_memory
    assert keep_freed_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
MB = 1 << 20
def touched(n):
    p = libc.malloc(n)
    ctypes.memset(p, 1, n)
    return p
def cycle():
    ps = [touched(7 * MB) for _ in range(3)]
    for p in ps:
        libc.free(p)
libc.free(touched(8 * MB))
cycle()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    cycle()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
"""
PAGES = 5 * 3 * (7 << 20) // 4096  # pages the 5 timed cycles write
GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def _faults(setting: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", CYCLES, setting], capture_output=True, text=True, env=env, check=True)
    return int(out.stdout)


def _huge_pages_always() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[always]" in f.read()
    except OSError:
        return False


@pytest.mark.skipif(not GLIBC, reason="glibc's allocator only")
def test_freed_blocks_are_reused_without_page_faults():
    kept, default = _faults("1"), _faults("0")
    # measured here: 0 faults with the setting, 26,720 of 26,880 pages with glibc's defaults
    assert kept < PAGES // 10, (kept, PAGES)
    if not _huge_pages_always():  # (with huge pages everywhere the defaults fault rarely too)
        assert default > PAGES // 2, (default, PAGES)


@pytest.mark.parametrize("var, value", [("MALLOC_TRIM_THRESHOLD_", "0"), ("MALLOC_MMAP_THRESHOLD_", "131072"),
                                        ("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=0")])
def test_the_users_own_thresholds_are_left_alone(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    assert keep_freed_memory() is False


def test_a_run_on_the_cpu_keeps_freed_memory(tmp_path, monkeypatch):
    from helpers import fedrun as run_cli

    import fedrun.run.runner as runner

    calls = []
    monkeypatch.setattr(runner, "keep_freed_memory", lambda: calls.append(1))
    r = run_cli(["data.num_clients=6", "data.seed=9", "rounds=1", "tau=1", "clients_per_round=2", "progress=false",
                 "device=cpu", f"hydra.run.dir={tmp_path / 'o'}"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert calls == [1]


def test_threads_option_resolves_per_launcher():
    from fedrun.device import TORCH_THREADS, cpu_threads
    from fedrun.errors import ConfigError

    joblib, batched = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher", \
        "hydra_plugins.fedrun_batched.BatchedLauncher"
    assert cpu_threads("auto", joblib) == 1 and cpu_threads("auto", batched) == 1
    assert cpu_threads("auto", "hydra._internal.core_plugins.basic_launcher.BasicLauncher") is None
    assert cpu_threads("auto", None) is None  # not under Hydra: left as they are
    assert cpu_threads("default", joblib) == TORCH_THREADS and cpu_threads(3, joblib) == 3
    for bad in (0, "two", True, 1.5):
        with pytest.raises(ConfigError, match=r"threads=.* choose one of: auto, default, or an integer >= 1"):
            cpu_threads(bad)
