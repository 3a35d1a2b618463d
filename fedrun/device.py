"""The `device=` option: auto | cpu | cuda | cuda:N; and the process's allocator settings for CPU runs."""
from __future__ import annotations

import ctypes
import os
import sys

import torch

from .algorithms.base import ConfigError


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu" or name == "cuda" or (name.startswith("cuda:") and name[5:].isdigit()):
        if name.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"device={name!r} but no CUDA device is available; use device=auto or device=cpu")
        return torch.device(name)
    raise ConfigError(f"device={name!r} is not allowed; choose one of: auto, cpu, cuda, cuda:N")


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_freed_memory(mmap_threshold: int = 64 << 20, trim_threshold: int = 256 << 20) -> bool:
    """Asks glibc's allocator to keep freed memory for reuse instead of handing it back to the
    operating system (Linux with glibc only; returns whether the settings took).

    A CPU round allocates and frees tensors of a few MB hundreds of times (the full passes' groups
    of 16k rows). With glibc's defaults such blocks are mapped fresh or trimmed off the heap when
    freed, so each new one is faulted in again page by page. Served from the heap (blocks below
    64 MB) and kept (up to 256 MB of free heap), they are reused: `fedrun-bench --algos
    perfedavg-fo,pfedme --loop-rounds 0 --threads 1`, four alternating pairs, took half the page
    faults (121k against 230-233k in all), the same peak memory (695-698 MB), Per-FedAvg FO
    0.088-0.111 s/round against 0.094-0.127 (medians 0.098 and 0.112) and pFedMe the same time
    (0.179-0.210 against 0.192-0.210). Freed memory stays with the process, up to the peak the run
    reached anyway. Where the user set glibc's own malloc tunables (MALLOC_* variables,
    GLIBC_TUNABLES=glibc.malloc.*), nothing is changed."""
    own = any(k.startswith("MALLOC_") for k in os.environ) or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", "")
    if not sys.platform.startswith("linux") or own:
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, trim_threshold))
    except (OSError, AttributeError):  # not glibc
        return False
