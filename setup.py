"""Packaging beside pyproject.toml: ships the repository's top-level conf/ inside the package as
`fedrun/conf` (package data), so an installed fedrun (a wheel, `pip install .`) finds its configs
(fedrun.config.CONF_DIR). conf/ stays the one source; nothing is copied in the repository.
hydra_plugins/fedrun_batched ships the hydra/launcher=batched launcher (Hydra finds launchers in the
hydra_plugins namespace package)."""
import os

from setuptools import find_namespace_packages, setup

CONF = [("fedrun.conf" + d[len("conf"):]).replace(os.sep, ".") for d, _, _ in os.walk("conf")]

setup(
    packages=find_namespace_packages(include=["fedrun", "fedrun.*", "hydra_plugins", "hydra_plugins.*"],
                                     exclude=["*.__pycache__"]) + CONF,
    package_dir={"fedrun.conf": "conf"},
    package_data={p: ["*.yaml"] for p in CONF},
)
