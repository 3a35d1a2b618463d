"""The `device=` option: auto | cpu | cuda | cuda:N; the `threads=` option; and the process's allocator
settings for CPU runs."""
from __future__ import annotations

import ctypes
import os
import platform
import sys

import torch

from .errors import ConfigError


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu" or name == "cuda" or (name.startswith("cuda:") and name.partition(":")[2].isdigit()):
        if name.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"device={name!r} but no CUDA device is available; use device=auto or device=cpu")
        return torch.device(name)
    raise ConfigError(f"device={name!r} is not allowed; choose one of: auto, cpu, cuda, cuda:N")


# torch's own CPU thread count in this process (OMP_NUM_THREADS or the cores), read before fedrun sets any
TORCH_THREADS = torch.get_num_threads()
# Launchers under which `threads=auto` gives each job one thread: the joblib launcher's jobs share the
# CPU's cores, and thread pools that spin under contention made a run beside another 7x slower (56 s
# against 8.4 s for 50 rounds, README "Engines and speed"); the batched launcher's jobs already
# train as one stacked computation.
ONE_THREAD_LAUNCHERS = ("JoblibLauncher", "BatchedLauncher")
THREADS_HELP = "auto, default, or an integer >= 1"


def cpu_threads(option, launcher: str | None = None) -> int | None:
    """The torch CPU threads a job sets, or None to leave them as they are.

    Args:
        option: `threads=`: auto (1 under the launchers of ONE_THREAD_LAUNCHERS, else as they are),
            default (torch's own, TORCH_THREADS) or a number.
        launcher: the `_target_` of the job's Hydra launcher, if any.
    """
    if option == "auto":
        return 1 if launcher and launcher.rsplit(".", 1)[-1] in ONE_THREAD_LAUNCHERS else None
    if option == "default":
        return TORCH_THREADS
    if isinstance(option, int) and not isinstance(option, bool) and option >= 1:
        return option
    raise ConfigError(f"threads={option!r} is not allowed; choose one of: {THREADS_HELP}")


# glibc's mallopt parameters (malloc.h), and the settings a user may have made instead
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_OWN_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
_OWN_TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold")


def keep_freed_memory(mmap_threshold: int = 32 << 20, trim_threshold: int = 256 << 20) -> bool:
    """Asks glibc's allocator to keep freed memory for reuse instead of handing it back to the
    operating system; fedrun's CPU runs and fedrun-bench call it. Returns whether both settings
    took (Linux with glibc only; with another allocator preloaded it changes nothing that is used).

    A CPU round allocates and frees tensors of a few MB hundreds of times (the full passes' groups
    of 16k rows). With glibc's defaults such blocks are mapped fresh or trimmed off the heap when
    freed, so each new one is faulted in again page by page. Served from the heap (blocks below
    32 MB, glibc's largest allowed threshold on 64-bit systems) and kept (up to 256 MB of free heap),
    they are reused. `fedrun-bench --algos perfedavg-fo,pfedme --loop-rounds 0 --threads 1`, six
    alternating pairs: 120-121k page faults in all against 160-233k, the same peak memory (692-698
    MB); in the four timed pairs Per-FedAvg FO 0.088-0.111 s/round against 0.094-0.127 (medians
    0.098 and 0.112), pFedMe the same (0.179-0.210 against 0.192-0.210). Freed memory stays with the
    process for reuse. Where the user set these two thresholds (MALLOC_MMAP_THRESHOLD_,
    MALLOC_TRIM_THRESHOLD_, or GLIBC_TUNABLES=glibc.malloc.mmap_threshold/trim_threshold), they are
    left as they are."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    own = any(k in os.environ for k in _OWN_ENV) or any(t in tunables for t in _OWN_TUNABLES)
    if not sys.platform.startswith("linux") or own or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        took = [libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold), libc.mallopt(_M_TRIM_THRESHOLD, trim_threshold)]
    except (OSError, AttributeError):
        return False
    return all(bool(t) for t in took)


def physical_memory() -> int:
    """This machine's memory in bytes (0 when unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0
