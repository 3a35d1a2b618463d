"""Every place fedrun reaches into Hydra's private code, here and nowhere else (pyproject.toml pins
hydra-core to the versions it was checked on; tests/test_hydra_compat.py fails when one of these
private functions is gone or is called differently).

`sweep_hooks`: fedrun checks every job of a sweep before its batch trains (fedrun.cli), which needs
the config Hydra's sweeper composes for each job before it launches the batch
(`ConfigLoaderImpl.load_sweep_config`, called by `Sweeper.validate_batch_is_legal`), and the moment
before the sweeper rewrites the sweep folder's multirun.yaml (`Plugins.instantiate_sweeper`).
Hydra has no public hook for either; a sweeper plugin of fedrun's would work with fedrun's sweeper
only, these with any sweeper that validates its batches (Hydra's basic one does). The launcher then
composes each job's config again, from the same master config and overrides: it gets the one the
validation composed instead (each handed out once), one composition (~0.15 CPU-s) fewer per sweep job,
for Hydra's basic launcher and fedrun's batched one alike.

`mode_without_composition`: Hydra composes the whole config once only to read `hydra.mode`
(`Hydra.get_mode`) before it composes it again to run; fedrun answers from the command line. Kept
for its measured saving: about 0.15 CPU-s per `fedrun` command, a composition (~0.15 s) of each of
the ~150 runs the test suite starts (the commit that moved it here has the numbers).

`omegaconf_yaml_loader`: OmegaConf's YAML rules (`omegaconf._utils.get_yaml_loader`) on libyaml's
parser, for fedrun.config.read_yaml (fedrun-report reads every job's .hydra/ files with it).

`libyaml_for_configs`: OmegaConf.load (with which Hydra reads every config file of every
composition) parses on libyaml instead of PyYAML's pure-Python parser: ~0.03 CPU-s of a ~0.17-s
composition, kept for the test suite's ~400 compositions.

`basic_sweep_jobs`: the jobs Hydra's basic sweeper makes of a sweep's overrides
(`BasicSweeper.split_arguments`), for fedrun-report to name the jobs of a sweep that never started.

(The batched launcher once kept the validation's configs itself, rebinding its loader's method; that
moved here, for every launcher, in sweep_hooks.)
"""
from __future__ import annotations

import contextlib
import functools
from typing import Callable, Iterator

import yaml
from omegaconf import DictConfig

# Most configs sweep_hooks keeps from a batch's validation for its launcher (a fedrun config is
# ~0.3 MB in memory): a larger batch's jobs past these are composed again, as without the hooks.
KEEP_COMPOSED = 256


@contextlib.contextmanager
def sweep_hooks(composed: Callable[[DictConfig, list], None],
                before_sweeper: Callable[[DictConfig], None]) -> Iterator[None]:
    """While in the block: `composed(cfg, sweep_overrides)` after Hydra composes a sweep job's
    config (each time: the sweeper's validation, and a launcher's own composition), and
    `before_sweeper(config)` when Hydra is about to make the sweeper (before it writes multirun.yaml).
    A config composed while the sweeper validates its batch is kept (at most KEEP_COMPOSED) and is
    what the launcher's composition of the same job (the same master config, the same overrides)
    gets, once: the same composition, not done twice. Hydra's own functions are restored afterwards."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.plugins import Plugins
    from hydra.plugins.sweeper import Sweeper

    compose, make_sweeper, validate = (ConfigLoaderImpl.load_sweep_config, Plugins.instantiate_sweeper,
                                       Sweeper.validate_batch_is_legal)
    validating = []  # non-empty while a sweeper validates a batch
    kept: dict[tuple, list] = {}  # (id(master config), overrides) -> [(master config, its config), ...]

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: list) -> DictConfig:
        key = (id(master_config), tuple(sweep_overrides))
        mine = kept.get(key) if not validating else None
        if mine and mine[0][0] is master_config:
            cfg = mine.pop(0)[1]
            if not mine:
                del kept[key]
        else:
            cfg = compose(self, master_config, sweep_overrides)
            if validating and sum(map(len, kept.values())) < KEEP_COMPOSED:
                kept.setdefault(key, []).append((master_config, cfg))
        composed(cfg, sweep_overrides)
        return cfg

    def validate_batch_is_legal(self, batch) -> None:
        kept.clear()  # a new batch: the last one's configs, if its launcher left any, are not reused
        validating.append(True)
        try:
            validate(self, batch)
        finally:
            validating.pop()

    def instantiate_sweeper(self, *, hydra_context, task_function, config: DictConfig):
        before_sweeper(config)
        return make_sweeper(self, hydra_context=hydra_context, task_function=task_function, config=config)

    ConfigLoaderImpl.load_sweep_config, Plugins.instantiate_sweeper = load_sweep_config, instantiate_sweeper
    Sweeper.validate_batch_is_legal = validate_batch_is_legal
    try:
        yield
    finally:
        ConfigLoaderImpl.load_sweep_config, Plugins.instantiate_sweeper = compose, make_sweeper
        Sweeper.validate_batch_is_legal = validate
        kept.clear()


def mode_from_command_line(argv: list[str]):
    """What Hydra's `get_mode` would find, without the composition it spends finding it.

    Before running, Hydra composes the whole config once just to read `hydra.mode`
    (`Hydra.get_mode`), then composes it again to run. No config in fedrun's conf/ sets `hydra.mode`
    (tests/test_hydra_compat.py checks every file), so with fedrun's configs alone the mode comes from
    the command line: `hydra.mode=RUN|MULTIRUN`, else None (Hydra then decides by -m). Returns False
    where a user's config (hydra.searchpath, --config-dir, --config-path, --config-name) could set
    it: then Hydra's own get_mode runs."""
    from hydra.types import RunMode

    mode = None
    for a in argv:
        key, _, value = a.partition("=")
        if key.lstrip("+~") == "hydra.searchpath" or key in ("--config-dir", "-cd", "--config-path", "-cp",
                                                              "--config-name", "-cn"):
            return False
        if key.lstrip("+") == "hydra.mode":
            if value not in ("RUN", "MULTIRUN"):
                return False  # Hydra's own error for a bad value
            mode = RunMode[value]
    return mode


@contextlib.contextmanager
def mode_without_composition(argv: list[str]) -> Iterator[None]:
    """While in the block, Hydra's `Hydra.get_mode` answers from the command line
    (`mode_from_command_line`) where that decides it: one composition fewer per `fedrun` command,
    about 0.15 CPU-s (measured in the commit that put it here); Hydra's own restored afterwards."""
    from hydra._internal.hydra import Hydra

    mode, hydras = mode_from_command_line(argv), Hydra.get_mode
    if mode is not False:
        Hydra.get_mode = lambda self, config_name, overrides: mode
    try:
        yield
    finally:
        Hydra.get_mode = hydras


@functools.lru_cache(maxsize=1)
def omegaconf_yaml_loader():
    """OmegaConf's YAML rules (its float syntax, no timestamps, duplicate keys refused) on libyaml's
    parser where PyYAML has it: 10-20x faster than OmegaConf.load's pure-Python parser on the large
    .hydra/hydra.yaml of every job (fedrun-report reads one per job)."""
    from omegaconf._utils import get_yaml_loader

    rules = get_yaml_loader()
    if not getattr(yaml, "__with_libyaml__", False):
        return rules

    class Loader(yaml.CSafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key, _ in node.value:
                if key.tag == yaml.resolver.BaseResolver.DEFAULT_SCALAR_TAG:
                    if key.value in seen:
                        raise yaml.constructor.ConstructorError("while constructing a mapping", node.start_mark,
                                                                f"found duplicate key {key.value}", key.start_mark)
                    seen.add(key.value)
            return super().construct_mapping(node, deep=deep)

    Loader.yaml_implicit_resolvers = {k: list(v) for k, v in rules.yaml_implicit_resolvers.items()}
    Loader.yaml_constructors = dict(rules.yaml_constructors)
    return Loader


def basic_sweep_jobs(overrides: list[str]) -> list[list[str]]:
    """The jobs Hydra's basic sweeper launches for a sweep's `overrides` (e.g. ["a=1,2", "b=x"] ->
    [["a=1", "b=x"], ["a=2", "b=x"]]), in its order, each as its list of overrides."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    batches = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(overrides), None)
    return [list(job) for batch in batches for job in batch]


@contextlib.contextmanager
def libyaml_for_configs() -> Iterator[None]:
    """While in the block, OmegaConf.load parses on libyaml with OmegaConf's rules
    (omegaconf_yaml_loader) instead of PyYAML's pure-Python parser: a pFedMe preset composes in
    ~90 ms instead of ~110. The same values on every shipped and Hydra config
    (tests/test_hydra_compat.py); OmegaConf's own loader restored afterwards."""
    import omegaconf._utils as omegaconf_utils

    loader, pure = omegaconf_yaml_loader(), omegaconf_utils.get_yaml_loader
    omegaconf_utils.get_yaml_loader = lambda: loader
    try:
        yield
    finally:
        omegaconf_utils.get_yaml_loader = pure
