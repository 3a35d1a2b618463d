"""One experiment, or a group of them: a sweep's jobs that differ only in `seed` train as ONE computation.

`run_jobs([(cfg, out_dir), ...])` is what `fedrun` does for one configuration (`run` is a list of one) and what the `hydra/launcher=batched` launcher (hydra_plugins/fedrun_batched) does for
a sweep. Jobs whose composed configurations are equal except for `seed` form a group: every seed's
server state, clients' states and random streams are stacked along the client dimension of one
round loop (`fedrun.simulate.simulate_group`), so each seed keeps its own model initialization,
sampled clients, minibatches and evaluation draws exactly as in a run of its own, and every job
writes its own folder (metrics.csv, clients.csv, partition.csv, summary.json, checkpoints/) as a
single run does. The data options (`data.*`, its own `data.seed` included) are part of the
configuration, so a group shares one dataset; `seed` never changes the data.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Callable

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from .. import outputs
from ..algorithms.base import ServerState
from ..algorithms.optim import local_optim
from ..errors import ConfigError
from ..data import FederatedData
from ..errors import DataMissingError
from ..device import cpu_threads, keep_freed_memory, resolve_device
from ..engine import ENGINES, params_of
from .protocol import apply_protocol
from .resume import find_resume_point, fingerprint
from .folder import WRITABLE, RunFolder, hydra_record, write_reason
from .acceleration import LocalSteps
from .memory import budget_bytes, plan as plan_memory
from ..config import instantiate_checked
from ..simulate import Diverged, Progress, Replica, simulate_group
from .trackers import Trackers
from .checks import check_model_fits, check_round_draws, schedule, validate

# What may differ between the jobs of one group: the seed. Options that change nothing but how a
# run shows itself are left out of the comparison too.
GROUP_FREE = ("seed", "progress", "plot")


def group_key(cfg: DictConfig) -> str:
    """Jobs with equal keys are one configuration run with different seeds."""
    c = OmegaConf.to_container(cfg, resolve=True)
    for k in GROUP_FREE:
        c.pop(k, None)
    return json.dumps(c, sort_keys=True, default=str)


class Job:
    """One run's setup, from its config to what its round loop needs: checked options, algorithm,
    data, model, schedule, resume point; its folder (`folder`, locked while the job holds it) takes
    what the run writes. `record`: its `.hydra/` files (default: `hydra_record` of the running Hydra job)."""

    def __init__(self, cfg: DictConfig, out_dir: str, data_cache: dict | None = None,
                 record: dict[str, str] | None = None, launcher: str | None = None):
        self.t0 = time.time()
        self.cfg, self.out_dir, self.launcher = cfg, out_dir, launcher
        record = record if record is not None else hydra_record(cfg)  # before the protocol fills options in
        self.protocol = apply_protocol(cfg)
        problems = validate(cfg)
        if problems:
            raise ConfigError("\n".join(problems))
        self.folder = RunFolder(out_dir, record, bool(cfg.plot), cfg.get("plot_format", "png"))  # one job per folder
        self.run: Replica | None = None
        self.trackers: Trackers | None = None
        try:
            self._accept(data_cache)
        except BaseException:
            self.folder.refuse()  # refused in a folder of its own making: no trace
            raise

    def close(self) -> None:
        """Releases the run folder."""
        self.folder.close()

    def _accept(self, data_cache: dict | None) -> None:
        cfg = self.cfg
        self.device = resolve_device(str(cfg.device))
        launcher = self.launcher
        if launcher is None and HydraConfig.initialized():
            launcher = HydraConfig.get().launcher.get("_target_")
        self.threads = cpu_threads(cfg.get("threads", "auto"), launcher)  # None: leave them as they are
        self.algo = instantiate_checked(cfg.algo)
        self.algo.set_optim(local_optim(cfg.get("optim"), cfg.rounds))
        data_key = json.dumps(OmegaConf.to_container(cfg.data, resolve=True), sort_keys=True, default=str)
        cache = {} if data_cache is None else data_cache
        if data_key not in cache:
            cache[data_key] = instantiate_checked(cfg.data)
        self.data: FederatedData = cache[data_key]
        self.sched = sched = schedule(cfg, self.data.num_train_clients)
        if self.data.num_holdout and getattr(self.algo, "train_all", False):
            raise ConfigError("partition.holdout needs an algorithm that trains only sampled clients; "
                              "algo.train_all=true trains every client (set it false or partition.holdout=0)")
        check_round_draws(sched, self.data.num_train_clients if self.algo.train_all else sched.clients_per_round,
                          self.algo.batches_per_step)
        for line in _warnings(cfg, self.data):
            print(f"fedrun: warning: {line}", file=sys.stderr)
        choices = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
        model = self.model()
        self.model_name = choices.get("model", cfg.model._target_)
        check_model_fits(model, self.data, self.model_name,
                         choices.get("data", self.data.name))  # before any file is written
        self.algo.check_params(params_of(model))  # the algorithm's own needs of the model (e.g. a body)
        self.folder.check_checkpoint_place()
        self.ck = find_resume_point(cfg, self.out_dir)
        self.done = self.folder.finished(sched.rounds, self.ck["round"] if self.ck is not None else None)
        if self.done is not None:  # the summary of a run that had already finished
            print(f"fedrun: already finished ({sched.rounds} rounds) in {self.out_dir}; resume=false starts over")

    def model(self, device: torch.device | None = None):
        torch.manual_seed(self.cfg.seed)
        model = instantiate_checked(self.cfg.model, in_features=self.data.in_features,
                                    num_classes=self.data.num_classes)
        return model if device is None else model.to(device)

    def replica(self, data: FederatedData, model) -> Replica:
        """Opens the run's files and trackers; returns its replica for the round loop (params from
        `model`, the server state from the resume point)."""
        cfg, ck, folder = self.cfg, self.ck, self.folder
        folder.start(data, ck)
        start = None
        if ck is not None:
            st = ck["state"]
            state = ServerState(params={k: v.to(self.device) for k, v in st["params"].items()},
                                extra=_to_device(st["extra"], self.device),
                                clients=_to_device(st.get("clients", {}), self.device))
            start = Progress(state, ck["round"], ck["transmitted"])
            print(f"fedrun: resuming from {ck['path']} (round {ck['round']})", file=sys.stderr)
        fp = fingerprint(cfg)
        self.trackers = trackers = Trackers(cfg, self.out_dir, f"{os.path.basename(os.path.normpath(self.out_dir))} "
                                            f"seed={cfg.seed}", ck["round"] if ck is not None else 0)

        def on_eval(rnd: int, transmitted: int, ev) -> None:
            row = {"round": rnd, "models_transmitted": transmitted, **ev.row}
            folder.log_row(row)
            trackers.log(row, rnd)

        def on_checkpoint(at: Progress) -> None:
            folder.save_checkpoint(at.round, {
                "config": fp, "transmitted": at.transmitted, "torch_rng": torch.get_rng_state(),
                "state": {"params": at.state.params, "extra": at.state.extra, "clients": at.state.clients}})

        minutes = cfg.get("checkpoint_minutes") or 0
        due = (lambda: time.time() - folder.saved_at >= 60 * minutes) if minutes else None
        self.run = Replica(cfg.seed, params_of(model), start, on_eval, on_checkpoint, checkpoint_due=due)
        return self.run

    def checkpoint_interrupted(self) -> int | None:
        """After an interrupt: checkpoints the last round the run finished, if no checkpoint holds it
        yet. Returns the round the run can resume from (None: none)."""
        run = self.run
        if run is not None and run.error is None and run.done is not None and run.done.round > (self.folder.saved_round or 0):
            run.on_checkpoint(run.done)
        return self.folder.saved_round

    def finish(self, run: Replica, data: FederatedData) -> dict | Diverged:
        """Writes clients.csv, summary.json (and metrics.png); returns the summary, or the
        divergence when the run diverged and `on_diverge=stop`."""
        cfg, device, history = self.cfg, self.device, self.folder.history
        self.folder.close_log()
        if self.trackers is not None:
            self.trackers.close("failed" if run.error is not None else "finished")
        if run.error is not None:
            e = run.error
            summary = {"status": "diverged", "error": str(e), **self.identity(),
                       **(_summary(history, time.time() - self.t0, cfg, device) if history else {})}
            self.folder.write_summary(summary)
            if cfg.on_diverge == "record":
                print(f"fedrun: diverged (recorded, on_diverge=record): {e}", file=sys.stderr)
                return summary
            return e
        if run.last is not None:
            self.folder.write_clients(data, run.last)
        summary = {"status": "finished", **self.identity(), **_summary(history, time.time() - self.t0, cfg, device),
                   "protocol": cfg.protocol, "protocol_choices": self.protocol}
        self.folder.write_summary(summary)
        self.plot()
        return summary

    def plot(self) -> None:
        """metrics.png from metrics.csv (with `plot`); also for a finished run that lacks it (a kill
        between summary.json and the figure)."""
        who = self.identity()
        self.folder.plot_metrics(title=f"{who['algo']} on {who['data']}, seed {self.cfg.seed}",
                                 personalized=f"personalized ({who['algo']}'s own personalization)")

    def identity(self) -> dict:
        """What summary.json says the run was: algorithm, data, model (config choices), preset, seed."""
        choices = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
        return {"algo": choices.get("algo") or getattr(self.algo, "name", str(self.cfg.algo.get("_target_"))),
                "data": choices.get("data") or self.data.name,
                "model": choices.get("model") or str(self.cfg.model.get("_target_")),
                "experiment": choices.get("experiment"), "seed": self.cfg.seed}


USER_ERRORS = (ConfigError, DataMissingError)


def run_jobs(jobs: list[tuple], max_group: int | None = None,
             launcher: str | None = None) -> list[dict | Exception]:
    """Runs every (config, output dir[, record]) job; jobs equal but for `seed` run together, at most
    `max_group` seeds at a time (None: all). `record`: the job's `.hydra/` files (`hydra_record`).
    `launcher`: the Hydra launcher's `_target_` running them (for `threads=auto`), when it is not
    the one HydraConfig holds.

    Returns, per job in order, its summary, or the exception that stopped it (a ConfigError or
    DataMissingError before any work, a Diverged with `on_diverge=stop`). A group's other jobs go on.
    """
    results: list[dict | Exception | None] = [None] * len(jobs)
    groups: dict[str, list[int]] = {}
    for i, (cfg, *_) in enumerate(jobs):
        groups.setdefault(group_key(cfg), []).append(i)
    for members in groups.values():
        size = max_group or len(members)
        for s in range(0, len(members), size):
            data_cache: dict = {}  # one dataset per group in memory
            part = []
            for i in members[s : s + size]:
                cfg, out_dir, *record = jobs[i]
                try:
                    job = Job(cfg, out_dir, data_cache, record[0] if record else None, launcher)
                except USER_ERRORS as e:
                    results[i] = e
                    continue
                if job.done is not None:
                    try:
                        if not os.path.exists(job.folder.figure("metrics")):
                            job.plot()
                    finally:
                        job.close()
                    results[i] = job.done
                else:
                    part.append((i, job))
            if part:
                try:
                    ends = _run_together([job for _, job in part])
                except USER_ERRORS as e:  # an output that cannot be written: every job of the group
                    ends = [e] * len(part)
                for (i, _), res in zip(part, ends):
                    results[i] = res
    return results


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised wherever the process is (`on_sigterm`): handled as Ctrl-C, exit status 143."""


def on_sigterm(signum, frame) -> None:
    raise Terminated()


def exit_status(interrupt: KeyboardInterrupt) -> int:
    """The shell's status for a process its signal ended: 128 + SIGINT (2) or SIGTERM (15)."""
    return 143 if isinstance(interrupt, Terminated) else 130


def _run_together(jobs: list[Job]) -> list[dict | Exception]:
    """One round loop for jobs that are one configuration with different seeds."""
    try:
        return _train(jobs)
    except OSError as e:  # a read-only folder, a full disk: one line, not a traceback
        raise ConfigError(outputs.cannot_write(e, WRITABLE, ", ".join(job.out_dir for job in jobs))) from None
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM: the last finished round kept, one line, no traceback
        # a second signal would cut the checkpoint short: the save is atomic, and quick, so it waits
        held = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            for job in jobs:
                try:
                    saved = job.checkpoint_interrupted()
                    go_on = f"resume from round {saved}" if saved else "start it again (no round finished)"
                except OSError as e:  # a full disk, a read-only folder: the previous checkpoint stays
                    go_on = (f"resume from round {job.folder.saved_round}" if job.folder.saved_round
                             else "start it again") + f" (no checkpoint written: {e.strerror or e})"
                done = job.run.done.round if job.run is not None else 0
                print(f"fedrun: interrupted after round {done} in {job.out_dir}; rerun the same command to {go_on}",
                      file=sys.stderr)
        finally:
            for s, handler in held.items():
                signal.signal(s, handler)
        sys.exit(exit_status(stop))
    finally:
        for job in jobs:
            job.close()


def _train(jobs: list[Job]) -> list[dict | Exception]:
    head = jobs[0]
    if head.device.type == "cpu":
        keep_freed_memory()
        if head.threads is not None:
            torch.set_num_threads(head.threads)
    cfg = head.cfg
    data = head.data.to(head.device)
    models = [job.model(head.device) for job in jobs]
    engine = ENGINES[cfg.engine](models[0], max_chunks=cfg.max_chunks)
    steps = LocalSteps(cfg.get("compile", "none"), cfg.get("precision", "fp32"))
    budget = budget_bytes(cfg.get("memory", "auto"), head.device)
    fitted = None
    if budget is not None:  # measured before any file is written: a run that cannot fit stops with one line
        try:
            fitted = plan_memory(head.algo, engine, data, head.sched, params_of(models[0]), cfg.seed, budget,
                                 len(jobs), steps, cfg.client_chunk, f"model={head.model_name}", cfg.get("memory", "auto"))
        except ConfigError:
            for job in jobs:  # refused before anything was written: folders of their own making go
                job.folder.refuse()
            raise
        print(f"fedrun: {fitted.line()}", file=sys.stderr)
    try:
        runs = [job.replica(data, model) for job, model in zip(jobs, models)]  # opens files and trackers
        simulate_group(head.algo, engine, data, runs, head.sched, progress=cfg.progress,
                       checkpoint_every=cfg.checkpoint_every, client_chunk=cfg.client_chunk, steps=steps,
                       start_chunk=None if fitted is None else fitted.clients)
    except BaseException:  # an error, a kill (KeyboardInterrupt), a tracker that cannot start:
        # the tracker runs opened so far end as stopped
        for job in jobs:
            if job.trackers is not None:
                job.trackers.close("stopped")
        raise
    finally:
        for job in jobs:
            job.folder.close_log()
    return [job.finish(run, data) for job, run in zip(jobs, runs)]


def keep_failure(out_dir: str, error: BaseException, record: dict[str, str] | None) -> None:
    """A sweep's job that failed keeps its folder with why (`run_folder.write_reason`: one line, and
    the job's `.hydra/` record), so fedrun-report names the job and its reason. A diverged job's
    summary.json says it already."""
    if isinstance(error, Diverged):
        return
    lines = str(error).strip().splitlines()
    reason = lines[0] if lines else type(error).__name__
    if not isinstance(error, USER_ERRORS):  # a crash: its kind too
        reason = f"{type(error).__name__}: {reason}"
    write_reason(out_dir, reason, record)


def report(result: dict | Exception, out_dir: str, record: dict[str, str] | None = None,
           refused: Callable[[str], None] | None = None) -> float | None:
    """Prints how a job ended and returns its headline accuracy; a failed job exits the process
    (2: bad options or data, 3: diverged), its reason kept in its folder (`keep_failure`, with its
    `record`), or, given `refused` (a single run's: it leaves no trace), `refused(out_dir)` instead."""
    if isinstance(result, Exception):
        if refused is None:
            keep_failure(out_dir, result, record)
        else:
            refused(out_dir)
        if os.environ.get("FEDRUN_DEBUG"):
            raise result
        for line in str(result).splitlines():
            print(f"fedrun: error: {line}", file=sys.stderr)
        sys.exit(3 if isinstance(result, Diverged) else 2)
    if result.get("status") == "finished":
        msg = ", ".join(f"{k}={v:.4f}" for k, v in result.items()
                        if k.endswith(("acc_last_round", "acc_best_round")) and "client" not in k)
        print(f"fedrun: done in {result['seconds']:.1f}s: {msg}")
    print(f"fedrun: outputs in {out_dir}")
    return result.get("pers_acc_last_round", result.get("global_acc_last_round"))


def run(cfg: DictConfig, out_dir: str) -> dict:
    """One experiment; writes its files into `out_dir` and returns the summary it writes
    (`run_jobs` with one job: the same code runs a batched sweep's groups)."""
    result, = run_jobs([(cfg, out_dir)])
    if isinstance(result, Exception):
        raise result
    return result


def _warnings(cfg: DictConfig, data: FederatedData) -> list[str]:
    """Settings that run, but likely not as meant."""
    out = []
    given = [str(o).lstrip("+").split("=", 1)[0] for o in HydraConfig.get().overrides.task] if HydraConfig.initialized() else []
    if cfg.frac is not None and "clients_per_round" in given:
        out.append(f"frac={cfg.frac} sets the clients per round; clients_per_round={cfg.clients_per_round} is ignored")
    largest = int(data.train.sizes.max())
    if cfg.batch_size > largest:
        out.append(f"batch_size={cfg.batch_size} is larger than every client's training rows (largest: {largest}); "
                   f"each minibatch repeats rows")
    return out


def _to_device(obj, device):
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _to_device(v, device) for k, v in obj.items()}
    return obj


def _summary(history: list[dict], seconds: float, cfg: DictConfig, device) -> dict:
    last = history[-1]
    out = {"rounds": last["round"], "seconds": round(seconds, 2), "device": str(device), "engine": cfg.engine,
           "threads": torch.get_num_threads()}
    for prefix in ("global", "pers", "new_global", "new_pers"):
        key = f"{prefix}_acc"
        if key not in last:
            continue
        best = max(history, key=lambda r: r[key])
        out[f"{prefix}_acc_last_round"] = last[key]
        out[f"{prefix}_acc_best_round"] = best[key]
        out[f"{prefix}_best_round"] = best["round"]
        out[f"{prefix}_acc_client_min_last_round"] = last[f"{prefix}_acc_min"]
        out[f"{prefix}_acc_client_max_last_round"] = last[f"{prefix}_acc_max"]
    return out
