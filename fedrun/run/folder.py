"""A run's folder: what one job writes there, and the promises about it (docs/outputs.md).

`RunFolder(path)` takes the folder's lock (one job per folder; the kernel frees it however the
process ends); the run's setup (fedrun.run.runner.Job) then reads the folder (a finished run's summary, the
checkpoint folder's place) and, once the run is accepted, `start` writes the `.hydra/` record and
partition.csv and sets metrics.csv to the rows the run resumes from. While it trains, `log` appends
one flushed row per evaluation and `save_checkpoint` writes a round atomically with the rows up to
it; at the end the summary, clients.csv and the figures. A refused job leaves no trace (`refuse`),
a sweep's failed job keeps why (`write_reason`).
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import time

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from .. import outputs
from ..errors import ConfigError

RECORD_DIR = ".hydra"
WRITABLE = "free space, or give the run a writable folder: hydra.run.dir=..., or hydra.sweep.dir=... for -m"


def hydra_record(cfg: DictConfig) -> dict[str, str] | None:
    """The `.hydra/` files (config.yaml, hydra.yaml, overrides.yaml) of the Hydra job now running,
    as Hydra would write them; None outside Hydra, or when Hydra writes them itself.

    conf/config.yaml sets `hydra.output_subdir: null`, so Hydra writes nothing before the job is
    accepted: a refused command (bad options, another configuration's checkpoint, a folder in use)
    leaves a finished run's record as it was. The job writes these once it starts (RunFolder.start).
    """
    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.instance().cfg
    if hc.hydra.output_subdir is not None:
        return None
    hy = copy.deepcopy(hc)
    with read_write(hy.hydra), open_dict(hy.hydra):
        hy.hydra.output_subdir = RECORD_DIR
    return {"config.yaml": OmegaConf.to_yaml(cfg), "hydra.yaml": OmegaConf.to_yaml(hy),
            "overrides.yaml": OmegaConf.to_yaml(hc.hydra.overrides.task)}


class RunFolder:
    """One job's folder, locked while the job holds it. `record`: its `.hydra/` files; `plot`,
    `plot_format`: whether and as what it draws its figures."""

    def __init__(self, path: str, record: dict[str, str] | None = None, plot: bool = True, plot_format: str = "png"):
        self.path, self.record, self.plot, self.plot_format = path, record, plot, plot_format
        self.own_lock_file = not os.path.lexists(self.file(outputs.LOCK_NAME))  # a refusal removes it (`refuse`)
        try:  # taken before the folder is read, released by close() or the process's end
            self.lock: int | None = outputs.lock_folder(path)
        except outputs.FolderBusy as e:
            raise ConfigError(str(e)) from None
        except OSError as e:  # a read-only folder, a file where the folder goes
            raise ConfigError(outputs.cannot_write(e, WRITABLE)) from None
        self.history: list[dict] = []  # the metrics rows, those a checkpoint held first
        self.log: outputs.CsvLog | None = None
        self.saved_round: int | None = None  # the newest round a checkpoint holds
        self.saved_at = time.time()

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def figure(self, name: str) -> str:
        """<run dir>/<name>.<plot_format>: where a figure of this run goes."""
        return self.file(f"{name}.{self.plot_format}")

    def refuse(self) -> None:
        """The job was refused before it wrote anything: no trace. The lock file goes unless the
        folder had one before (a run's that finished there), and so does a folder left empty."""
        if self.lock is not None and (self.own_lock_file or os.listdir(self.path) == [outputs.LOCK_NAME]):
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.file(outputs.LOCK_NAME))  # while held: a contender re-checks it (lock_folder)
        self.close()
        discard_empty(self.path)

    def close(self) -> None:
        """Releases the folder (its metrics log closed first)."""
        self.close_log()
        outputs.unlock_folder(self.lock)
        self.lock = None

    def close_log(self) -> None:
        if self.log is not None:
            self.log.close()
            self.log = None

    def check_checkpoint_place(self) -> None:
        checkpoints = self.file("checkpoints")
        if os.path.lexists(checkpoints) and not os.path.isdir(checkpoints):
            raise ConfigError(f"{checkpoints} is not a folder, and the run keeps its checkpoints there; "
                              f"move it away, or {WRITABLE}")

    def finished(self, rounds: int, checkpoint_round: int | None) -> dict | None:
        """The summary of a run of `rounds` rounds that finished here (its checkpoint at its last
        round), else None; a torn summary.json: None (the run finishes again)."""
        if checkpoint_round is None or checkpoint_round < rounds:
            return None
        done = _read_summary(self.file("summary.json"))
        if done.get("status") == "finished" and done.get("rounds") == checkpoint_round == rounds:
            return done
        return None

    def start(self, data, resumed: dict | None) -> None:
        """The run is accepted: its record, partition.csv (and figure), and metrics.csv exactly the
        rows of the checkpoint `resumed` (later rows, if a kill left any, are recomputed
        identically); a fresh run's metrics.csv is its own (an old one becomes metrics.csv.previous)."""
        os.makedirs(self.path, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):  # an earlier attempt's failure: this one starts
            os.remove(self.file(outputs.REASON_FILE))
        if self.record is not None:
            for name, text in self.record.items():
                os.makedirs(self.file(RECORD_DIR), exist_ok=True)
                outputs.write_atomic(os.path.join(self.path, RECORD_DIR, name), text)
        outputs.write_partition(data, self.file("partition.csv"))
        if self.plot:
            from ..plots import plot_partition

            plot_partition(data.train.label_counts(data.num_classes).cpu().numpy(), data.num_holdout,
                           self.figure("partition"))
        metrics = self.file("metrics.csv")
        if resumed is not None:
            self.history = list(resumed["history"])
            self.saved_round = resumed["round"]
            if self.history:
                outputs.write_csv(metrics, self.history)
            elif os.path.exists(metrics):
                os.remove(metrics)
        elif os.path.exists(metrics):  # a fresh run owns its metrics; never append to an old run's
            os.replace(metrics, metrics + ".previous")
        self.saved_at = time.time()

    def log_row(self, row: dict) -> None:
        """Appends one evaluation's row to metrics.csv, flushed."""
        if self.log is None:
            columns = list(row)
            if self.history and list(self.history[0]) != columns:  # a checkpoint from before a column
                columns += [k for k in self.history[0] if k not in row]  # existed: its rows get it empty
                outputs.write_csv(self.file("metrics.csv"), self.history, columns)
            self.log = outputs.CsvLog(self.file("metrics.csv"), columns)
        self.log.write(row)
        self.history.append(row)

    def save_checkpoint(self, rnd: int, payload: dict) -> None:
        """checkpoints/round_<rnd>.pt: `payload` and the metrics rows up to round `rnd` (an
        interrupt's checkpoint of the last finished round: a row the next round logged is not its)."""
        outputs.save_checkpoint(self.file("checkpoints"), rnd,
                                {**payload, "history": [row for row in self.history if row["round"] <= rnd]})
        self.saved_round, self.saved_at = rnd, time.time()

    def write_summary(self, summary: dict) -> None:
        outputs.write_json(self.file("summary.json"), summary)

    def write_clients(self, data, ev) -> None:
        outputs.write_clients(data, ev, self.file("clients.csv"))

    def plot_metrics(self, title: str, personalized: str) -> None:
        """metrics.<plot_format> from metrics.csv (with `plot`)."""
        if self.plot:
            from ..plots import plot_run

            plot_run(self.file("metrics.csv"), self.figure("metrics"), title=title, personalized=personalized)


def discard_empty(out_dir: str) -> None:
    """Removes `out_dir` if it is empty: the folder Hydra made for a command that was then refused
    (so fedrun-report and `ls outputs/runs` never show it)."""
    try:
        os.rmdir(out_dir)
    except OSError:  # not empty (a run's files), or already gone
        pass


def write_reason(out_dir: str, reason: str, record: dict[str, str] | None) -> None:
    """A sweep's job that failed keeps its folder with why: `outputs.REASON_FILE` (`reason`, one
    line) and, where the folder has none, the job's `.hydra/` record, so fedrun-report names the job
    and its reason (a job that never started has no folder)."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        if record is not None and not os.path.exists(os.path.join(out_dir, RECORD_DIR, "config.yaml")):
            os.makedirs(os.path.join(out_dir, RECORD_DIR), exist_ok=True)
            for name, text in record.items():
                outputs.write_atomic(os.path.join(out_dir, RECORD_DIR, name), text)
        outputs.write_atomic(os.path.join(out_dir, outputs.REASON_FILE), reason + "\n")
    except OSError:  # the folder cannot be written (the reason itself, often): the console has the line
        discard_empty(out_dir)


def _read_summary(path: str) -> dict:
    """A run's summary.json; {} when there is none, or it is not a whole JSON object (a kill
    mid-write on a file system without atomic rename, another tool's file)."""
    try:
        with open(path, encoding="utf-8") as f:
            summary = json.load(f)
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) else {}
