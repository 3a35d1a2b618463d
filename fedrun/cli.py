"""`fedrun`: compose (Hydra) -> instantiate data, model, algorithm -> simulate -> write outputs.

The work lives in: config (where configs are), validation (option checks, `precheck` of the command
line), device, resume (fingerprint, checkpoint matching), runner (one experiment) and outputs.
"""
from __future__ import annotations

import contextlib
import os
import sys

from . import openmp  # noqa: F401 - first: sets GOMP_SPINCOUNT before torch loads (fedrun/openmp.py)

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from .algorithms.base import ConfigError
from .config import CONF_DIR, GROUPS, PRESETS, with_composed_data, with_dataset_root, with_env_searchpath  # noqa: F401 - re-exported
from .data import DataMissingError
from .device import resolve_device  # noqa: F401 - re-exported
from .outputs import write_atomic
from .resume import RESUMABLE_CHANGES, find_resume_point, fingerprint  # noqa: F401 - re-exported
from .runner import discard_empty, run
from .simulate import Diverged
from .validation import DATA_INTS, precheck, schedule, validate  # noqa: F401

__all__ = ["main", "run", "precheck", "validate", "schedule", "fingerprint", "find_resume_point", "resolve_device",
           "CONF_DIR", "GROUPS", "PRESETS", "RESUMABLE_CHANGES", "DATA_INTS"]


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> float | None:
    out_dir = HydraConfig.get().runtime.output_dir
    try:
        summary = run(cfg, out_dir)
    except (ConfigError, DataMissingError, Diverged) as e:
        discard_empty(out_dir)
        if os.environ.get("FEDRUN_DEBUG"):
            raise
        for line in str(e).splitlines():
            print(f"fedrun: error: {line}", file=sys.stderr)
        sys.exit(3 if isinstance(e, Diverged) else 2)
    if summary.get("status") == "finished":
        msg = ", ".join(f"{k}={v:.4f}" for k, v in summary.items() if k.endswith(("acc_last_round", "acc_best_round")) and "client" not in k)
        print(f"fedrun: done in {summary['seconds']:.1f}s: {msg}")
    print(f"fedrun: outputs in {out_dir}")
    return summary.get("pers_acc_last_round", summary.get("global_acc_last_round"))


def _mode_from_command_line(argv: list[str]):
    """What Hydra's `get_mode` would find, without the extra composition it spends finding it.

    Before running, Hydra composes the whole config once just to read `hydra.mode`, then composes it
    again to run: about 40% of a small run's CPU time (0.48 -> 0.30 CPU-s for a 2-round MLR run). No
    config in fedrun's conf/ sets `hydra.mode` (tests/test_cli.py checks every file), so with fedrun's
    configs alone the mode comes from the command line: `hydra.mode=RUN|MULTIRUN`, else None (Hydra
    then decides by -m). Returns False where a user's config (hydra.searchpath, --config-dir,
    --config-path, --config-name) could set it: then Hydra's own get_mode runs."""
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
def _mode_without_composition(argv: list[str]):
    """Hydra's get_mode answered from the command line (see above) while fedrun runs, then restored."""
    from hydra._internal.hydra import Hydra

    mode, hydras = _mode_from_command_line(argv), Hydra.get_mode
    if mode is not False:
        Hydra.get_mode = lambda self, config_name, overrides: mode
    try:
        yield
    finally:
        Hydra.get_mode = hydras


@contextlib.contextmanager
def _libyaml_for_configs():
    """While fedrun runs, OmegaConf.load (with which Hydra reads every config file of every job's
    composition, again for each job of a sweep) parses on libyaml with OmegaConf's rules
    (fedrun.config._yaml_loader) instead of PyYAML's pure-Python parser: a pFedMe preset composes in
    ~90 ms instead of ~110. The same values on every shipped and Hydra config
    (tests/test_report.py::test_read_yaml_reads_as_omegaconf_does); restored afterwards."""
    import omegaconf._utils as omegaconf_utils

    from .config import _yaml_loader

    loader, pure = _yaml_loader(), omegaconf_utils.get_yaml_loader
    omegaconf_utils.get_yaml_loader = lambda: loader
    try:
        yield
    finally:
        omegaconf_utils.get_yaml_loader = pure


@contextlib.contextmanager
def _jobs_checked_before_the_sweep():
    """Hydra's sweeper composes every job's config of a batch (by default: the whole sweep) before
    it launches the batch (validate_batch_is_legal). While fedrun runs, each config composed so is
    checked as its job would check it when it starts (fedrun.validation.job_problems, once per job,
    under the job's hydra.job.env_set): a sweep with one refused combination (e.g. algo=fedbn,fedavg
    model=mlp_bn: FedAvg's test-time update on a BatchNorm model) stops with one line before its
    batch trains, not after the jobs before it. A config this cannot check outside its job (e.g.
    ${hydra:job.num}) is left to the job. The sweep folder's multirun.yaml, which Hydra rewrites
    first, is put back as it was (removed, with the folder, if the sweep made them)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.plugins import Plugins
    from hydra.core.utils import env_override, filter_overrides

    from .validation import job_problems

    compose, make_sweeper = ConfigLoaderImpl.load_sweep_config, Plugins.instantiate_sweeper
    checked, refused, kept = set(), [], {}  # kept: multirun.yaml's path -> its text before the sweep (None: none)

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: list) -> DictConfig:
        cfg = compose(self, master_config, sweep_overrides)
        if tuple(sweep_overrides) not in checked:
            checked.add(tuple(sweep_overrides))
            try:
                with env_override({str(k): str(v) for k, v in cfg.hydra.job.env_set.items()}):
                    problems = job_problems(cfg)
            except Exception:  # noqa: BLE001 - not checkable here (e.g. ${hydra:...}): the job checks itself
                problems = []
            if problems:
                job = " ".join(filter_overrides(sweep_overrides))
                print(f"fedrun: error: {problems[0]} (sweep job: {job}; refused before its batch started)",
                      file=sys.stderr)
                refused.append(job)
                sys.exit(2)
        return cfg

    def instantiate_sweeper(self, *, hydra_context, task_function, config: DictConfig):
        # (the sweeper's own class is re-imported by Hydra's plugin scan: its multirun.yaml, written
        # when the sweep begins, is kept here, where the sweeper is made)
        path = os.path.join(str(config.hydra.sweep.dir), "multirun.yaml")
        try:
            with open(path, encoding="utf-8") as f:
                kept[path] = f.read()
        except OSError:
            kept[path] = None
        return make_sweeper(self, hydra_context=hydra_context, task_function=task_function, config=config)

    ConfigLoaderImpl.load_sweep_config, Plugins.instantiate_sweeper = load_sweep_config, instantiate_sweeper
    try:
        yield
    except SystemExit:
        for path, before in kept.items() if refused else ():  # the sweep folder goes back as it was
            if before is not None:
                write_atomic(path, before)
            elif os.path.exists(path) and os.listdir(os.path.dirname(path)) == ["multirun.yaml"]:
                os.remove(path)
                discard_empty(os.path.dirname(path))
        raise
    finally:
        ConfigLoaderImpl.load_sweep_config, Plugins.instantiate_sweeper = compose, make_sweeper


def main() -> None:
    sys.argv[1:] = with_env_searchpath(sys.argv[1:])  # $FEDRUN_CONF_PATH: the user's config folders
    sys.argv[1:] = with_dataset_root(sys.argv[1:])  # dataset.root=DIR for a data= preset: its data.root
    sys.argv[1:] = with_composed_data(sys.argv[1:])  # dataset=... partition=...: data=composed
    wants_help = any(a in ("--help", "-h") for a in sys.argv[1:])
    problem = precheck(sys.argv[1:], complete=not wants_help)  # `partition=dirichlet --help` alone explains it
    if problem:
        print(f"fedrun: error: {problem}", file=sys.stderr)
        sys.exit(2)
    if wants_help:  # the options explained (Hydra's own: --hydra-help)
        from .help import help_text

        sys.stdout.write(help_text(sys.argv[1:]))
        return
    try:
        with _mode_without_composition(sys.argv[1:]), _libyaml_for_configs(), _jobs_checked_before_the_sweep():
            _hydra_main()
    except KeyboardInterrupt:  # before training (the round loop says where it stopped itself)
        print("fedrun: interrupted; nothing was trained yet, rerun the same command to start", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
