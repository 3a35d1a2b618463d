"""Shared by the test files: the config group options as Hydra sees them, and the `fedrun` command
line run in this process (no new Python + torch + Hydra start per case).

`tests/` is on sys.path (pytest puts a rootless conftest's folder there), so test files in
subfolders import these helpers with `from conftest import ...` and `from helpers import ...`."""
from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
from dataclasses import dataclass

from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from fedrun.cli import CONF_DIR

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def group_options(group: str) -> list[str]:
    """The options of a config group (algo, data, model, experiment), as Hydra lists them."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return sorted(GlobalHydra.instance().config_loader().get_group_options(group))


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def fedrun(args: list[str], cwd, env: dict | None = None) -> Result:
    """`fedrun *args` in `cwd`, run in this process through fedrun.cli.main: what it prints, and the
    exit status its SystemExit carries (0 when it returns). FEDRUN_CACHE is `cwd`/cache; torch uses
    one thread, as the subprocess runs do (OMP_NUM_THREADS=1), so their numbers compare byte for byte."""
    import torch

    from fedrun.cli import main

    env = {"FEDRUN_CACHE": str(os.path.join(cwd, "cache")), **(env or {})}
    saved_env = {k: os.environ.get(k) for k in env}
    saved_argv, saved_cwd = sys.argv, os.getcwd()
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    out, err = io.StringIO(), io.StringIO()
    code = 0
    threads = torch.get_num_threads()
    GlobalHydra.instance().clear()
    try:
        torch.set_num_threads(1)
        os.environ.update(env)
        os.chdir(cwd)
        sys.argv = ["fedrun", *map(str, args)]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        GlobalHydra.instance().clear()
        torch.set_num_threads(threads)
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for h in root.handlers:  # Hydra's job logging: a console handler on our StringIO, a log file
            if h not in saved_handlers:
                h.close()
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
    return Result(code, out.getvalue(), err.getvalue())


def fedrun_subprocess(args: list[str], cwd, env: dict | None = None) -> Result:
    """`python -m fedrun.cli *args` in a new process (the smoke tests: what a user really runs)."""
    env = {**os.environ, "FEDRUN_CACHE": str(os.path.join(cwd, "cache")), "OMP_NUM_THREADS": "1", **(env or {})}
    r = subprocess.run([sys.executable, "-m", "fedrun.cli", *map(str, args)], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=300)
    return Result(r.returncode, r.stdout, r.stderr)
