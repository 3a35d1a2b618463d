"""One experiment, or a group of them: a sweep's jobs that differ only in `seed` train as ONE computation.

`run_jobs([(cfg, out_dir), ...])` is what `fedrun` does for one configuration (`run` is a list of one)
and what the `hydra/launcher=batched` launcher (hydra_plugins/fedrun_batched) does for a sweep. Jobs
whose composed configurations are equal except for `seed` form a group: every seed's
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
from omegaconf import DictConfig, OmegaConf

from .. import outputs
from ..algorithms.base import flat_clients, state_of
from ..data import FederatedData
from ..device import keep_freed_memory
from ..engine import ENGINES, params_of
from ..errors import ConfigError, DataMissingError
from ..simulate import Diverged, Progress, Replica, simulate_group
from .acceleration import LocalSteps
from .folder import WRITABLE, RunFolder, hydra_record, write_reason
from .memory import budget_bytes
from .memory import plan as plan_memory
from .resume import resume_point, resume_point_at
from .spec import RunSpec
from .trackers import Trackers

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
    """One run of a checked spec (`spec`: fedrun.run.spec.RunSpec, built once) in its folder (`folder`:
    a RunFolder, locked while the job holds it): where it resumes from, its replica for the round loop,
    its checkpoints and its end. It never reads the config. `started`: when the job's setup began
    (time.time(); summary.json's seconds count from it)."""

    def __init__(self, spec: RunSpec, folder: RunFolder, started: float | None = None):
        self.t0 = time.time() if started is None else started
        self.spec, self.folder, self.out_dir = spec, folder, folder.path
        self.algo, self.data, self.sched, self.device = spec.algo, spec.data, spec.schedule, spec.device.device
        self.run: Replica | None = None
        self.trackers: Trackers | None = None
        try:
            folder.check_checkpoint_place()
            self.ck = resume_point(spec.output.resume, spec.fingerprint, self.out_dir)
            self.done = folder.finished(self.sched.rounds, self.ck["round"] if self.ck is not None else None)
            if self.ck is not None and self.done is None:
                check_checkpoint_shapes(self.ck, params_of(spec.model))
        except BaseException:
            folder.refuse()  # refused in a folder of its own making: no trace
            raise
        if self.done is not None:  # the summary of a run that had already finished
            print(f"fedrun: already finished ({self.sched.rounds} rounds) in {self.out_dir}; resume=false starts over")

    def close(self) -> None:
        """Releases the run folder."""
        self.folder.close()

    def replica(self, data: FederatedData, model) -> Replica:
        """Opens the run's files and trackers; returns its replica for the round loop (params from
        `model`, the server state from the resume point)."""
        spec, ck, folder = self.spec, self.ck, self.folder
        folder.start(data, ck)
        start = None
        if ck is not None:
            st = ck["state"]
            state = state_of(spec.algo, {k: v.to(self.device) for k, v in st["params"].items()},
                             _to_device(st["extra"], self.device), _to_device(st.get("clients", {}), self.device))
            start = Progress(state, ck["round"], ck["transmitted"])
            print(f"fedrun: resuming from {ck['path']} (round {ck['round']})", file=sys.stderr)
        fp = spec.fingerprint
        self.trackers = trackers = Trackers(spec.output.trackers, self.out_dir,
                                            f"{os.path.basename(os.path.normpath(self.out_dir))} seed={spec.seed}",
                                            ck["round"] if ck is not None else 0, spec.config)

        def on_eval(rnd: int, transmitted: int, ev) -> None:
            row = {"round": rnd, "models_transmitted": transmitted, **ev.row}
            folder.log_row(row)
            trackers.log(row, rnd)

        def on_checkpoint(at: Progress) -> None:
            folder.save_checkpoint(at.round, {
                "config": fp, "transmitted": at.transmitted, "torch_rng": torch.get_rng_state(),
                "state": {"params": at.state.params, "extra": at.state.extra, "clients": flat_clients(at.state)}})

        minutes = spec.output.checkpoint_minutes
        due = (lambda: time.time() - folder.saved_at >= 60 * minutes) if minutes else None
        self.run = Replica(spec.seed, params_of(model), start, on_eval, on_checkpoint, checkpoint_due=due)
        return self.run

    def checkpoint_interrupted(self) -> int | None:
        """After an interrupt: checkpoints the last round the run finished, if no checkpoint holds it
        yet. Returns the round the run can resume from (None: none)."""
        run = self.run
        if (run is not None and run.error is None and run.done is not None
                and run.done.round > (self.folder.saved_round or 0)):
            run.on_checkpoint(run.done)
        return self.folder.saved_round

    def finish(self, run: Replica, data: FederatedData) -> dict | Diverged:
        """Writes clients.csv, summary.json (and metrics.png); returns the summary, or the
        divergence when the run diverged and `on_diverge=stop`."""
        spec, history = self.spec, self.folder.history
        self.folder.close_log()
        if self.trackers is not None:
            self.trackers.close("failed" if run.error is not None else "finished")
        if run.error is not None:
            e = run.error
            summary = {"status": "diverged", "error": str(e), **self.identity(),
                       **(_summary(history, time.time() - self.t0, spec) if history else {})}
            self.folder.write_summary(summary)
            if spec.output.on_diverge == "record":
                print(f"fedrun: diverged (recorded, on_diverge=record): {e}", file=sys.stderr)
                return summary
            return e
        if run.last is not None:
            self.folder.write_clients(data, run.last)
        summary = {"status": "finished", **self.identity(), **_summary(history, time.time() - self.t0, spec),
                   "protocol": spec.protocol, "protocol_choices": spec.protocol_choices}
        self.folder.write_summary(summary)
        self.plot()
        return summary

    def plot(self) -> None:
        """metrics.png from metrics.csv (with `plot`); also for a finished run that lacks it (a kill
        between summary.json and the figure)."""
        who = self.identity()
        self.folder.plot_metrics(title=f"{who['algo']} on {self.spec.data_title}, seed {self.spec.seed}",
                                 personalized=f"personalized ({who['algo']}'s own personalization)")

    def identity(self) -> dict:
        """What summary.json says the run was: algorithm, data, model (config choices), preset, seed."""
        return dict(self.spec.identity)


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
                    job = _job(cfg, out_dir, data_cache, record[0] if record else None, launcher)
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
                    _resume_together([job for _, job in part])
                    ends = _run_together([job for _, job in part])
                except USER_ERRORS as e:  # an output that cannot be written: every job of the group
                    ends = [e] * len(part)
                for (i, _), res in zip(part, ends):
                    results[i] = res
    return results


def _resume_together(jobs: list[Job]) -> None:
    """Seeds of one group resume from one round: a kill between their checkpoints' writes (each
    atomic, one after the other) can leave some a checkpoint ahead of the others. Those go back to
    the group's common round, from their own checkpoint of it (a folder keeps its newest two, and
    a group checkpoints at the same rounds), so the group trains on as the uninterrupted one did.
    Where one lacks that checkpoint, the seeds resume from their own rounds, said in one line (their
    numbers may then differ from the uninterrupted sweep's in the last float bits)."""
    if len(jobs) < 2 or any(str(job.spec.output.resume) not in ("auto", "True", "true") for job in jobs):
        return  # (resume=false starts every seed over; resume=<path> is what the user chose)
    rounds = [job.ck["round"] if job.ck is not None else 0 for job in jobs]
    common = min(rounds)
    if common == max(rounds):
        return
    back = [(job, resume_point_at(job.spec.fingerprint, job.out_dir, common) if common else None)
            for job, rnd in zip(jobs, rounds) if rnd > common]
    if common and any(ck is None for _, ck in back):
        print(f"fedrun: warning: the seeds of one group were stopped at rounds {sorted(set(rounds))} and not all "
              f"keep a checkpoint of round {common}; each resumes from its own round", file=sys.stderr)
        return
    for job, ck in back:
        print(f"fedrun: {job.out_dir}: its group's other seeds stopped at round {common}; it goes back to "
              f"{'round ' + str(common) if common else 'the start'} with them (from its round {job.ck['round']})",
              file=sys.stderr)
        job.ck = ck


def _job(cfg: DictConfig, out_dir: str, data_cache: dict, record: dict[str, str] | None,
         launcher: str | None) -> Job:
    """The job of `cfg` in `out_dir`: its spec (the one pass over the options; the data from
    `data_cache` when a job of the group built it), then its folder, locked. `record`: its `.hydra/`
    files (default: `hydra_record` of the running Hydra job)."""
    started = time.time()
    record = record if record is not None else hydra_record(cfg)  # before the protocol fills options in
    spec = RunSpec.from_config(cfg, data_cache, launcher)
    return Job(spec, RunFolder(out_dir, record, spec.output.plot, spec.output.plot_format), started)


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
    dev = head.spec.device
    if dev.device.type == "cpu":
        keep_freed_memory()
        if dev.threads is not None:
            torch.set_num_threads(dev.threads)
    data = head.data.to(head.device)
    models = [job.spec.model.to(head.device) for job in jobs]  # each built once, by its spec
    last = jobs[-1].spec  # the generators as they were after the last model was built (its seed, then its init)
    torch.manual_seed(last.seed)
    torch.set_rng_state(last.rng)
    engine = ENGINES[dev.engine](models[0], max_chunks=dev.max_chunks)
    steps = LocalSteps(dev.compile, dev.precision)
    budget = budget_bytes(dev.memory, head.device)
    fitted = None
    if budget is not None:  # measured before any file is written: a run that cannot fit stops with one line
        try:
            fitted = plan_memory(head.algo, engine, data, head.sched, params_of(models[0]), head.spec.seed, budget,
                                 len(jobs), steps, dev.client_chunk, f"model={head.spec.model_name}", dev.memory)
        except ConfigError:
            for job in jobs:  # refused before anything was written: folders of their own making go
                job.folder.refuse()
            raise
        print(f"fedrun: {fitted.line()}", file=sys.stderr)
    try:
        runs = [job.replica(data, model) for job, model in zip(jobs, models)]  # opens files and trackers
        simulate_group(head.algo, engine, data, runs, head.sched, progress=head.spec.output.progress,
                       checkpoint_every=head.spec.output.checkpoint_every, client_chunk=dev.client_chunk, steps=steps,
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
    """A sweep's job that failed keeps its folder with why (`folder.write_reason`: one line, and
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


def check_checkpoint_shapes(ck: dict, params: dict) -> None:
    """One line when the checkpoint's server model is not shaped as this run's model (a text model
    written before its embedding followed the corpus's vocabulary: dataset.vocab_size is capped at the
    training rows' distinct tokens), rather than a run that resumes on parameters its model lacks."""
    saved = ck["state"]["params"]
    for name, p in params.items():
        got = saved.get(name)
        if got is None or tuple(got.shape) != tuple(p.shape):
            was = "no such entry" if got is None else f"shape {list(got.shape)}"
            why = (" (a text model's embedding has the vocabulary's rows: dataset.vocab_size is capped at the training "
                   "rows' distinct tokens + 2)") if name.endswith("embedding.weight") else ""
            raise ConfigError(f"the checkpoint {ck['path']} holds {name} of {was}, this run's model {list(p.shape)}"
                              f"{why}; start over with resume=false or run elsewhere (hydra.run.dir=...)")

def _to_device(obj, device):
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _to_device(v, device) for k, v in obj.items()}
    return obj


def _summary(history: list[dict], seconds: float, spec: RunSpec) -> dict:
    last = history[-1]
    out = {"rounds": last["round"], "seconds": round(seconds, 2), "device": str(spec.device.device),
           "engine": spec.device.engine,
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
