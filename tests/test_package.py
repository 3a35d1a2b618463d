"""fedrun as a package: one list of options that do not change the numbers, configs shipped in the
wheel, user configs through Hydra's search path, one source of defaults, rough edges."""
import os

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from fedrun import outputs
from fedrun.algorithms.base import ConfigError
from fedrun.config import CONF_DIR, NEUTRAL_OPTIONS, neutral_options
from fedrun.report.jobs import NEUTRAL_KEYS
from fedrun.resume import find_resume_point, fingerprint


def composed(*overrides, hydra_node=False):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra_node)


def test_one_list_of_options_that_do_not_change_the_numbers():
    cfg = composed("data=cifar10_acid", hydra_node=True)
    assert list(cfg.hydra.job.config.override_dirname.exclude_keys) == ["seed", *NEUTRAL_OPTIONS]
    assert NEUTRAL_KEYS == {"seed", *NEUTRAL_OPTIONS}
    fp = fingerprint(composed("data=cifar10_acid"))
    assert "download" not in fp["data"] and "root" not in fp["data"] and "device" not in fp and "seed" in fp
    assert "_target_" in fp["data"] and fp["tau"] == 10


def _checkpoint(tmp_path, cfg, config=None):
    outputs.save_checkpoint(str(tmp_path / "checkpoints"), 5, {
        "config": fingerprint(cfg) if config is None else config, "state": {}, "transmitted": 0, "history": []})


def test_resume_after_adding_data_download_false_is_accepted(tmp_path):
    _checkpoint(tmp_path, composed("data=cifar10_acid", "rounds=10"))
    ck = find_resume_point(composed("data=cifar10_acid", "rounds=10", "data.download=false", "device=cpu"), str(tmp_path))
    assert ck is not None and ck["round"] == 5
    with pytest.raises(ConfigError, match=r"different configuration \(tau: 10 -> 5\)"):
        find_resume_point(composed("data=cifar10_acid", "rounds=10", "tau=5"), str(tmp_path))


def test_checkpoint_of_an_older_fingerprint_with_more_options_is_accepted(tmp_path):
    cfg = composed("data=cifar10_acid")
    old = OmegaConf.to_container(cfg, resolve=True)  # what older fedrun stored: data.download, data.root, ...
    old.pop("resume")
    _checkpoint(tmp_path, cfg, config=old)
    assert find_resume_point(composed("data=cifar10_acid", "data.download=false"), str(tmp_path)) is not None
