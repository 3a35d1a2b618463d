"""fedrun's entry points set GOMP_SPINCOUNT before torch loads, and leave a user's own setting alone."""
import os
import subprocess
import sys

import pytest

CHECK = ("import os, sys, {module}; from fedrun import openmp; "
         "print(openmp.TORCH_LOADED_FIRST, 'torch' in sys.modules, os.environ.get('GOMP_SPINCOUNT'))")


def _run(module: str, **env_set) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env.update(env_set)
    return subprocess.run([sys.executable, "-c", CHECK.format(module=module)], env=env, check=True,
                          capture_output=True, text=True).stdout.split()


@pytest.mark.parametrize("module", ["fedrun.cli", "fedrun.bench.cli"])
def test_entry_points_set_the_spin_count_before_torch_loads(module):
    # torch is loaded by the entry point, but only after fedrun.openmp set the variable
    assert _run(module) == ["False", "True", "10000"]


@pytest.mark.parametrize("env_set, expected", [({"GOMP_SPINCOUNT": "5"}, "5"),
                                               ({"OMP_WAIT_POLICY": "ACTIVE"}, "None")])
def test_a_users_own_setting_is_kept(env_set, expected):
    assert _run("os", **env_set) == ["False", "False", expected]
