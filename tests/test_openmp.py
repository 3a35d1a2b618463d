"""fedrun's entry points set GOMP_SPINCOUNT before torch loads, and leave a user's own setting alone."""
import os
import subprocess
import sys

import pytest

CHECK = ("import os, sys, {module}; from fedrun import openmp; "
         "print(openmp.TORCH_LOADED_FIRST, 'torch' in sys.modules, os.environ.get('GOMP_SPINCOUNT'))")

# A new interpreter imports the entry point; the moment it first asks for torch, it prints whether
# fedrun.openmp has run and the GOMP_SPINCOUNT torch would load under, and exits there: torch's own
# import (~3 CPU-s) is not needed to see what it would read. An entry point that never imports torch
# prints nothing.
AT_TORCH = """
import importlib.abc, os, sys
class AtTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            print("fedrun.openmp" in sys.modules, os.environ.get("GOMP_SPINCOUNT"), flush=True)
            os._exit(0)
sys.meta_path.insert(0, AtTorch())
import {module}
"""


def _run(code: str, **env_set) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env.update(env_set)
    return subprocess.run([sys.executable, "-c", code], env=env, check=True,
                          capture_output=True, text=True).stdout.split()


@pytest.mark.parametrize("module", ["fedrun.cli", "fedrun.bench.cli"])
def test_entry_points_set_the_spin_count_before_torch_loads(module):
    # the entry point loads torch, but only after fedrun.openmp set the variable
    assert _run(AT_TORCH.format(module=module)) == ["True", "10000"]


@pytest.mark.parametrize("env_set, expected", [({"GOMP_SPINCOUNT": "5"}, "5"),
                                               ({"OMP_WAIT_POLICY": "ACTIVE"}, "None")])
def test_a_users_own_setting_is_kept(env_set, expected):
    assert _run(CHECK.format(module="os"), **env_set) == ["False", "False", expected]
