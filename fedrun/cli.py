"""`fedrun`: compose (Hydra) -> instantiate data, model, algorithm -> simulate -> write outputs.

The work lives in: config (where configs are), run/ (checks.py: `precheck` of the command line;
spec.py: the one pass over a run's options, RunSpec; runner.py: one experiment, or a group of seeds;
folder.py: what a run writes) and hydra_compat (fedrun's only hooks into Hydra's private code).
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

# isort: off
from . import openmp  # noqa: F401 - first: sets GOMP_SPINCOUNT before torch loads (fedrun/openmp.py)
# isort: on

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from .config import CONF_DIR, read_yaml, with_dataset_root, with_env_searchpath
from .hydra_compat import libyaml_for_configs, mode_without_composition, sweep_hooks
from .outputs import write_atomic
from .run.checks import job_problems, precheck
from .run.folder import discard_empty, hydra_record
from .run.runner import exit_status, keep_failure, on_sigterm, report, run_jobs

__all__ = ["main"]


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> float | None:
    out_dir = HydraConfig.get().runtime.output_dir
    single = HydraConfig.get().mode != RunMode.MULTIRUN
    record = hydra_record(cfg)
    try:
        result, = run_jobs([(cfg, out_dir, record)])
    except Exception as e:
        if not single:  # a crash: its kind and first line kept in a sweep's job folder, the traceback printed as ever
            keep_failure(out_dir, e, record)
        raise
    # a refused single run leaves no folder; a sweep's failed job keeps why, for fedrun-report
    return report(result, out_dir, record, refused=discard_new_folders if single else None)


@contextlib.contextmanager
def _jobs_checked_before_the_sweep():
    """Hydra's sweeper composes every job's config of a batch (by default: the whole sweep) before
    it launches the batch (validate_batch_is_legal). While fedrun runs, each config composed so is
    checked as its job would check it when it starts (fedrun.run.checks.job_problems, once per job,
    under the job's hydra.job.env_set): a sweep with one refused combination (e.g. algo=fedbn,fedavg
    model=mlp_bn: FedAvg's test-time update on a BatchNorm model) stops with one line before its
    batch trains, not after the jobs before it. A config this cannot check outside its job (e.g.
    ${hydra:job.num}) is left to the job. The sweep folder's multirun.yaml, which Hydra rewrites
    first, is put back as it was (removed, with the folder, if the sweep made them). The hooks into
    Hydra: fedrun.hydra_compat.sweep_hooks."""
    from hydra.core.utils import env_override, filter_overrides

    checked, refused, kept = set(), [], {}  # kept: multirun.yaml's path -> its text before the sweep (None: none)

    def check(cfg: DictConfig, sweep_overrides: list) -> None:
        if tuple(sweep_overrides) in checked:
            return
        checked.add(tuple(sweep_overrides))
        try:
            with env_override({str(k): str(v) for k, v in cfg.hydra.job.env_set.items()}):
                problems = job_problems(cfg)
        except Exception:  # noqa: BLE001 - not checkable here (e.g. ${hydra:...}): the job checks itself
            problems = []
        if problems:
            job = " ".join(filter_overrides(sweep_overrides))
            print(f"fedrun: error: {problems[0]} (sweep job: {job}; refused before its batch started)", file=sys.stderr)
            refused.append(job)
            sys.exit(2)

    def keep_multirun_yaml(config: DictConfig) -> None:
        path = os.path.join(str(config.hydra.sweep.dir), "multirun.yaml")
        try:
            with open(path, encoding="utf-8") as f:
                kept[path] = f.read()
        except OSError:
            kept[path] = None

    with sweep_hooks(check, keep_multirun_yaml):
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


def _output_place(argv: list[str]) -> tuple[str, str, str]:
    """Where this command's runs go: the option (hydra.run.dir, or hydra.sweep.dir for a sweep), its
    value (the command line's, else conf/config.yaml's) and its fixed part, the folders before the
    first ${...} (e.g. outputs/runs)."""
    sweep = any(a in ("-m", "--multirun") for a in argv) or "hydra.mode=MULTIRUN" in argv
    option = "hydra.sweep.dir" if sweep else "hydra.run.dir"
    value = next((a.split("=", 1)[1] for a in reversed(argv) if a.lstrip("+").startswith(option + "=")), None)
    if value is None:
        value = str(read_yaml(os.path.join(CONF_DIR, "config.yaml"))["hydra"]["sweep" if sweep else "run"]["dir"])
    fixed = value.split("${", 1)[0]
    fixed = fixed if "${" not in value else os.path.dirname(fixed)
    return option, value, fixed or "."


def _place_problem(option: str, value: str, fixed: str) -> str | None:
    """Why the runs cannot be written where `option` puts them (checked before Hydra makes the folder:
    its own error is a traceback), or None."""
    place = os.path.abspath(fixed)
    while not os.path.lexists(place):
        place = os.path.dirname(place)
    if not os.path.isdir(place):
        return f"{option}={value}: {place} is a file, not a folder; name a folder for the run's files"
    if not os.access(place, os.W_OK | os.X_OK) or os.statvfs(place).f_flag & os.ST_RDONLY:
        return f"{option}={value}: {place} is read-only; name a folder fedrun may write ({option}=...)"
    return None


def _new_folders(fixed: str) -> list[str]:
    """The folders of `fixed` that do not exist yet, deepest first (what a refused command removes)."""
    out, place = [], os.path.abspath(fixed)
    while not os.path.lexists(place):
        out.append(place)
        place = os.path.dirname(place)
    return out


NO_RUN_FLAGS = ("--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--shell-completion", "-sc", "--version")
_NEW_FOLDERS: list[str] = []  # the output folders this command makes on its way to the run's own


def discard_new_folders(out_dir: str) -> None:
    """After a refused run: its folder (if empty) and the empty folders above it that the command
    made (a fresh clone's first refused command leaves no outputs/runs/ behind)."""
    discard_empty(out_dir)
    for folder in _NEW_FOLDERS:
        discard_empty(folder)


def main() -> None:
    sys.argv[1:] = with_env_searchpath(sys.argv[1:])  # $FEDRUN_CONF_PATH: the user's config folders
    sys.argv[1:] = with_dataset_root(sys.argv[1:])  # dataset.root=DIR for a data= preset: its data.root
    wants_help = any(a in ("--help", "-h") for a in sys.argv[1:])
    # (`partition=dirichlet --help` alone explains it: not a complete run's options)
    problem = precheck(sys.argv[1:], complete=not wants_help) or _launcher_problem(sys.argv[1:])
    if not problem and not any(a.split("=")[0] in NO_RUN_FLAGS for a in sys.argv[1:]):  # a run: where it writes
        place = _output_place(sys.argv[1:])
        problem = _place_problem(*place)
        _NEW_FOLDERS[:] = _new_folders(place[2])
    if problem:
        print(f"fedrun: error: {problem}", file=sys.stderr)
        sys.exit(2)
    if wants_help:  # the options explained (Hydra's own: --hydra-help)
        from .help import help_text

        sys.stdout.write(help_text(sys.argv[1:]))
        return
    try:
        with mode_without_composition(sys.argv[1:]), libyaml_for_configs(), _jobs_checked_before_the_sweep(), \
                _sigterm_as_interrupt():
            _hydra_main()
    except KeyboardInterrupt as stop:  # before training (the round loop says where it stopped itself)
        print("fedrun: interrupted; nothing was trained yet, rerun the same command to start", file=sys.stderr)
        sys.exit(exit_status(stop))


def _launcher_problem(argv: list[str]) -> str | None:
    """A launcher Hydra does not have, or a batched launcher's `max_group` below 1, in one line
    (Hydra's own errors are 16 and 5 lines); None when the command line sets neither."""
    for a in argv:
        key, _, value = a.lstrip("+").partition("=")
        if key == "hydra/launcher":
            from hydra import initialize_config_dir
            from hydra.core.global_hydra import GlobalHydra

            with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
                allowed = sorted(GlobalHydra.instance().config_loader().get_group_options("hydra/launcher"))
            if value not in allowed:
                return f"hydra/launcher={value} is not a launcher; allowed: {', '.join(allowed)}"
        elif key == "hydra.launcher.max_group" and value != "null":
            if not value.isdigit() or int(value) < 1:
                return f"hydra.launcher.max_group={value} must be an integer >= 1 or null (null: all seeds together)"
    return None


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM (a scheduler's stop, `kill`) ends a run as Ctrl-C does: the last finished round
    checkpointed, one line, exit 143 (fedrun.run.runner.Terminated); the previous handler restored."""
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return
    before = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


if __name__ == "__main__":
    main()
