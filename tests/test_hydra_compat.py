"""fedrun.hydra_compat: each hook into Hydra's private code fails here, in a second, when the Hydra
installed no longer has the function it replaces or no longer calls it as fedrun relies on (the
end-to-end behaviour: tests/test_batched.py's refused sweeps, tests/test_cli.py's runs)."""
from __future__ import annotations

import glob
import inspect
import os

import pytest
import yaml
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.hydra import Hydra
from hydra._internal.utils import create_config_search_path
from hydra.core.global_hydra import GlobalHydra
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, RunMode

from fedrun.config import CONF_DIR
from fedrun.hydra_compat import (
    basic_sweep_jobs,
    libyaml_for_configs,
    mode_from_command_line,
    mode_without_composition,
    omegaconf_yaml_loader,
    sweep_hooks,
)


@pytest.fixture
def hydra():
    GlobalHydra.instance().clear()
    try:
        yield Hydra.create_main_hydra2("fedrun", create_config_search_path(CONF_DIR))
    finally:
        GlobalHydra.instance().clear()


def _params(fn) -> list[tuple[str, object]]:
    return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()]


def test_the_private_functions_replaced_are_there_as_fedrun_calls_them():
    P = inspect.Parameter
    assert _params(Hydra.get_mode) == [("self", P.POSITIONAL_OR_KEYWORD), ("config_name", P.POSITIONAL_OR_KEYWORD),
                                       ("overrides", P.POSITIONAL_OR_KEYWORD)]
    assert _params(ConfigLoaderImpl.load_sweep_config) == [
        ("self", P.POSITIONAL_OR_KEYWORD), ("master_config", P.POSITIONAL_OR_KEYWORD),
        ("sweep_overrides", P.POSITIONAL_OR_KEYWORD)]
    assert _params(Plugins.instantiate_sweeper) == [("self", P.POSITIONAL_OR_KEYWORD),
                                                    ("hydra_context", P.KEYWORD_ONLY),
                                                    ("task_function", P.KEYWORD_ONLY), ("config", P.KEYWORD_ONLY)]


def test_a_sweepers_batch_check_composes_through_the_hooked_loader(hydra):
    """Sweeper.validate_batch_is_legal (run by Hydra's sweeper before each batch) composes every job
    with ConfigLoaderImpl.load_sweep_config: fedrun's per-job check sees each job's config there."""
    seen = []
    master = hydra.compose_config("config", ["rounds=1"], run_mode=RunMode.MULTIRUN,
                                  with_log_configuration=False)

    class Minimal(Sweeper):
        def setup(self, *, hydra_context, task_function, config):
            pass

        def sweep(self, arguments):
            pass

    sweeper = Minimal()
    sweeper.config = master
    sweeper.hydra_context = HydraContext(config_loader=hydra.config_loader, callbacks=None)
    before = ConfigLoaderImpl.load_sweep_config
    with sweep_hooks(lambda cfg, overrides: seen.append((cfg.seed, list(overrides))), lambda config: None):
        sweeper.validate_batch_is_legal([["seed=3"], ["seed=4"]])
    assert ConfigLoaderImpl.load_sweep_config is before  # Hydra's own again
    assert seen == [(3, ["seed=3"]), (4, ["seed=4"])]


def test_the_launcher_gets_the_configs_the_validation_composed_once_each(hydra, monkeypatch):
    """A job's config composed by the sweeper's validation is the one the launcher's composition of
    that job returns (once: the next composition composes anew), equal to a fresh composition; a
    composition outside a validation, or from another master config, is Hydra's own."""
    import fedrun.hydra_compat as compat

    master = hydra.compose_config("config", ["rounds=1"], run_mode=RunMode.MULTIRUN, with_log_configuration=False)
    other = hydra.compose_config("config", ["rounds=1"], run_mode=RunMode.MULTIRUN, with_log_configuration=False)

    class Minimal(Sweeper):
        def setup(self, *, hydra_context, task_function, config):
            pass

        def sweep(self, arguments):
            pass

    sweeper = Minimal()
    sweeper.config = master
    sweeper.hydra_context = HydraContext(config_loader=hydra.config_loader, callbacks=None)
    own, validate = ConfigLoaderImpl.load_sweep_config, Sweeper.validate_batch_is_legal
    fresh = own(hydra.config_loader, master, ["seed=4"])
    calls = []
    monkeypatch.setattr(ConfigLoaderImpl, "load_sweep_config", lambda *a: calls.append(a[2]) or own(*a))
    monkeypatch.setattr(compat, "KEEP_COMPOSED", 2)
    seen = []
    spy = ConfigLoaderImpl.load_sweep_config
    with sweep_hooks(lambda cfg, overrides: seen.append(cfg), lambda config: None):
        sweeper.validate_batch_is_legal([["seed=3"], ["seed=4"], ["seed=5"]])
        assert calls == [["seed=3"], ["seed=4"], ["seed=5"]]
        launched = [hydra.config_loader.load_sweep_config(master, [f"seed={s}"]) for s in (3, 4, 5)]
        assert launched[:2] == seen[:2] and all(a is b for a, b in zip(launched, seen[:2]))
        assert calls[3:] == [["seed=5"]]  # past KEEP_COMPOSED: composed again
        assert launched[1] == fresh and launched[1].seed == 4
        again = hydra.config_loader.load_sweep_config(master, ["seed=3"])  # handed out once
        assert again is not launched[0] and again == launched[0] and calls[4:] == [["seed=3"]]
        sweeper.validate_batch_is_legal([["seed=6"]])
        mine = hydra.config_loader.load_sweep_config(other, ["seed=6"])  # another master config
        assert mine is not seen[-2] and calls[5:] == [["seed=6"], ["seed=6"]]
    assert ConfigLoaderImpl.load_sweep_config is spy and Sweeper.validate_batch_is_legal is validate


def test_no_config_sets_hydra_mode_so_the_command_line_decides_it():
    """mode_from_command_line is right only while no file in conf/ sets hydra.mode."""
    setting = []
    for path in glob.glob(os.path.join(CONF_DIR, "**", "*.yaml"), recursive=True):
        node = yaml.safe_load(open(path)) or {}
        if isinstance(node, dict) and "mode" in (node.get("hydra") or {}):
            setting.append(path)
    assert not setting


@pytest.mark.parametrize("argv", [[], ["algo=pfedme", "experiment=pfedme_synthetic_mlr_pfedme"],
                                  ["hydra.mode=MULTIRUN"],
                                  ["hydra.mode=RUN", "seed=1"]])
def test_mode_from_the_command_line_is_hydras(argv, hydra):
    assert mode_from_command_line(argv) == hydra.get_mode("config", list(argv))
    own = Hydra.get_mode
    with mode_without_composition(argv):
        assert Hydra.get_mode is not own and hydra.get_mode("config", list(argv)) == mode_from_command_line(argv)
    assert Hydra.get_mode is own
    assert mode_from_command_line(["hydra.searchpath=[file:///x]"]) is False
    assert mode_from_command_line(["--config-dir", "/x"]) is False


def test_omegaconf_load_parses_with_the_libyaml_loader_alike(tmp_path):
    """Under libyaml_for_configs, OmegaConf.load asks omegaconf._utils.get_yaml_loader for its loader
    (fedrun's libyaml one, seen here) and reads every shipped config, Hydra's own and OmegaConf's own
    cases as its pure-Python loader does."""
    import hydra
    import omegaconf._utils as U
    from omegaconf import OmegaConf

    odd = tmp_path / "odd.yaml"
    odd.write_text("a: 1e-3\nb: 2020-01-01\nc: ${a}\nd: .5\ne: [1, '2', null, true]\nf: {g: -.inf}\nh: 1_000\n")
    hydras = glob.glob(os.path.join(os.path.dirname(hydra.__file__), "conf", "**", "*.yaml"), recursive=True)
    files = [*glob.glob(os.path.join(CONF_DIR, "**", "*.yaml"), recursive=True), *hydras, str(odd)]
    pure = U.get_yaml_loader
    calls = []
    with libyaml_for_configs():
        ours = U.get_yaml_loader
        assert ours() is not pure() and ours().__mro__[1] is yaml.CSafeLoader
        U.get_yaml_loader = lambda: calls.append(1) or ours()  # (a spy; the block restores OmegaConf's own)
        got = {path: OmegaConf.to_yaml(OmegaConf.load(path)) for path in files}
    assert U.get_yaml_loader is pure and len(calls) >= len(files)
    for path in files:
        assert got[path] == OmegaConf.to_yaml(OmegaConf.load(path)), path
    (tmp_path / "dup.yaml").write_text("a: 1\na: 2\n")
    with libyaml_for_configs(), pytest.raises(Exception, match="duplicate key"):
        OmegaConf.load(tmp_path / "dup.yaml")


def test_omegaconf_yaml_loader_reads_with_omegaconfs_rules(tmp_path):
    """omegaconf_yaml_loader (fedrun.config.read_yaml's) keeps OmegaConf's YAML rules: `1e-3` a float,
    a date a string, where PyYAML's safe loader reads a string and a date; duplicate keys refused."""
    from omegaconf import OmegaConf

    text = "a: 1e-3\nb: 2020-01-01\nc: ${a}\nd: .5\nh: 1_000\n"
    (tmp_path / "x.yaml").write_text(text)
    got = yaml.load(text, Loader=omegaconf_yaml_loader())
    assert got == OmegaConf.to_container(OmegaConf.load(tmp_path / "x.yaml")) == {
        "a": 0.001, "b": "2020-01-01", "c": "${a}", "d": 0.5, "h": 1000}
    assert yaml.safe_load(text)["a"] == "1e-3"  # what the rules change
    with pytest.raises(yaml.constructor.ConstructorError, match="duplicate key"):
        yaml.load("a: 1\na: 2\n", Loader=omegaconf_yaml_loader())


def test_yaml_values_are_omegaconf_loads_a_copy_each_call_and_the_file_read_again_when_it_changes(tmp_path):
    """fedrun.config.yaml_values (the algorithms' `_target_` and defaults without a DictConfig) gives
    OmegaConf.load's values for every shipped config, a copy a caller may change, and a changed
    file's new values; each algorithm's defaults are its yaml's options."""
    from omegaconf import OmegaConf

    from fedrun.algorithms import algorithm_class, names
    from fedrun.algorithms.options import conf_defaults
    from fedrun.config import group_file, load_conf, yaml_values

    for path in glob.glob(os.path.join(CONF_DIR, "**", "*.yaml"), recursive=True):
        assert yaml_values(path) == OmegaConf.to_container(OmegaConf.load(path)), path
    mine = tmp_path / "x.yaml"
    mine.write_text("a: {b: [1, 2]}\n")
    yaml_values(str(mine))["a"]["b"].append(3)
    assert yaml_values(str(mine)) == {"a": {"b": [1, 2]}} and load_conf(str(mine)).a.b == [1, 2]
    mine.write_text("a: {b: [1, 2, 3, 4]}\n")
    assert yaml_values(str(mine)) == {"a": {"b": [1, 2, 3, 4]}}
    for name in names():
        options = OmegaConf.to_container(load_conf(group_file("algo", name)))
        assert conf_defaults(algorithm_class(name)) == {k: v for k, v in options.items() if k[0] != "_"}, name


def test_basic_sweep_jobs_are_the_jobs_hydras_basic_sweeper_launches():
    """basic_sweep_jobs (fedrun-report's list of a sweep's planned jobs) is BasicSweeper.split_arguments
    as Hydra's basic sweeper calls it: every combination, the last override varying fastest."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    P = inspect.Parameter
    assert _params(BasicSweeper.split_arguments) == [("overrides", P.POSITIONAL_OR_KEYWORD),
                                                     ("max_batch_size", P.POSITIONAL_OR_KEYWORD)]
    assert basic_sweep_jobs(["seed=0,1", "algo=fedavg,ditto", "rounds=2"]) == [
        ["seed=0", "algo=fedavg", "rounds=2"], ["seed=0", "algo=ditto", "rounds=2"],
        ["seed=1", "algo=fedavg", "rounds=2"], ["seed=1", "algo=ditto", "rounds=2"]]
    assert basic_sweep_jobs(["rounds=2"]) == [["rounds=2"]]
