"""Experiment trackers besides the CSVs (`logger=tensorboard|mlflow|wandb`, several as
`logger=[tensorboard,mlflow]`; conf/logger): every evaluated round's metrics.csv row, at step =
round, and the resolved config, all offline by default (TensorBoard event files, MLflow's local
file store, W&B's offline mode), with the packages' own telemetry turned off (`Tracker.telemetry_off`):
a run opens no network connection unless a tracking server is named, and a named one that does not
answer within REACH_TIMEOUT seconds refuses the run before any work.

Each tracker is an optional extra (`pip install -e ".[tensorboard]"`); `check` names a missing
package before any work. A resumed run continues its tracker run: the ids are kept in
<run dir>/trackers.json, TensorBoard hides the steps after the checkpoint that a killed run had
already written (purge_step). Each job has its own tracker objects, so the batched launcher's jobs,
in one process, log to runs of their own.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import socket
import threading
import time
import urllib.parse

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from .. import outputs
from ..config import instantiate_checked
from ..errors import ConfigError

STATE_FILE = "trackers.json"  # per run dir: what a resumed run needs to continue its tracker runs


class Tracker:
    """One tracker of one run. `package`: the module it needs; `extra`: fedrun's pip extra for it;
    `telemetry_off`: the package's own settings that stop what it sends home by itself (usage
    telemetry, error reports: not the run's data), set before it is imported unless the user set them."""

    package = ""
    extra = ""
    telemetry_off: dict[str, str] = {}

    def problem(self) -> str | None:
        """Why this tracker cannot start here (checked before any work), else None."""
        return None

    def open(self, out_dir: str, name: str, config: dict, start: int, state: dict) -> dict:
        """Starts (start = 0) or continues (start = the checkpoint's round) the run; `state` is what
        this tracker returned for the run dir last time ({} if nothing). Returns the state to keep."""
        raise NotImplementedError

    def log(self, row: dict, step: int) -> None:
        raise NotImplementedError

    def close(self, status: str) -> None:
        """status: finished | failed | stopped (an error or a kill outside fedrun's control)."""


def _numbers(row: dict) -> dict[str, float]:
    return {k: float(v) for k, v in row.items()
            if k != "round" and isinstance(v, (int, float)) and not isinstance(v, bool)}


def _flat(tree: dict, prefix: str = "") -> dict[str, str]:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


class TensorBoard(Tracker):
    package, extra = "tensorboard", "tensorboard"

    def __init__(self, dir: str = "tensorboard"):  # noqa: A002 - the config's name
        self.dir = dir
        self.writer = None

    def open(self, out_dir, name, config, start, state):
        from torch.utils.tensorboard import SummaryWriter

        log_dir = os.path.join(out_dir, self.dir)
        if start == 0 and os.path.isdir(log_dir):  # a fresh run's curves never mix with an old run's
            previous = log_dir + ".previous"
            shutil.rmtree(previous, ignore_errors=True)
            os.replace(log_dir, previous)
        # resumed: the event files go on in the same folder; steps a killed run wrote after the
        # checkpoint are hidden, as they are recomputed
        self.writer = SummaryWriter(log_dir=log_dir, purge_step=start + 1 if start else None)
        if start == 0:
            text = OmegaConf.to_yaml(OmegaConf.create(config))
            self.writer.add_text("config", "".join(f"    {line}\n" for line in text.splitlines()), 0)
        return {"log_dir": log_dir}

    def log(self, row, step):
        for k, v in _numbers(row).items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self, status):
        if self.writer is not None:
            self.writer.close()
            self.writer = None


REACH_TIMEOUT = 5.0  # seconds a tracking server gets to accept a connection before the run is refused


@functools.lru_cache(maxsize=None)
def unreachable(uri: str, timeout: float = REACH_TIMEOUT) -> str | None:
    """Why the http(s) server of `uri` accepts no TCP connection within `timeout` seconds (the name
    lookup included), else None; None for other schemes (a local file store needs no server). Once
    per process and address: a sweep's jobs share the answer."""
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as e:
        return str(e)
    result: dict[str, object] = {}

    def connect():
        try:
            socket.create_connection((parts.hostname, port), timeout=timeout).close()
            result["ok"] = True
        except OSError as e:
            result["error"] = e.strerror or str(e) or type(e).__name__

    thread = threading.Thread(target=connect, daemon=True)  # a name lookup ignores socket timeouts
    thread.start()
    thread.join(timeout)
    if result.get("ok"):
        return None
    return str(result.get("error") or f"no answer in {timeout:g} s")


class MLflow(Tracker):
    package, extra = "mlflow", "mlflow"
    telemetry_off = {"MLFLOW_DISABLE_TELEMETRY": "true"}

    def __init__(self, tracking_uri: str | None = None, experiment: str = "fedrun"):
        self.tracking_uri, self.experiment = tracking_uri, experiment
        self.client = self.run_id = None

    def uri(self) -> str:
        return self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or "file:" + os.path.abspath("mlruns")

    def problem(self):
        why = unreachable(self.uri())
        if why is None:
            return None
        where = (f"logger.mlflow.tracking_uri={self.tracking_uri!r}" if self.tracking_uri
                 else f"MLFLOW_TRACKING_URI={self.uri()!r}")
        return (f"{where} cannot be reached ({why}; waited up to {REACH_TIMEOUT:g} s): start the MLflow server or fix "
                f"the address; logger.mlflow.tracking_uri=null (and no MLFLOW_TRACKING_URI) logs to ./mlruns offline")

    def open(self, out_dir, name, config, start, state):
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        uri = self.uri()
        if uri.startswith("file:") or "://" not in uri:
            # MLflow 3 keeps the file store (no database needed: offline, as it is) behind this opt-in
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = client = MlflowClient(tracking_uri=uri)
        if start and state.get("run_id") and state.get("tracking_uri") == uri:
            try:
                client.update_run(state["run_id"], status="RUNNING")  # the same run goes on
                self.run_id = state["run_id"]
                return state
            except MlflowException:
                pass  # not in this store any more: a new run, named as a continuation
        exp = client.get_experiment_by_name(self.experiment)
        exp_id = exp.experiment_id if exp is not None else client.create_experiment(self.experiment)
        run = client.create_run(exp_id, run_name=name if not start else f"{name} (resumed at round {start})",
                                tags={"fedrun.run_dir": os.path.abspath(out_dir)})
        self.run_id = run.info.run_id
        client.log_dict(self.run_id, config, "config.yaml")
        params = [Param(k, str(v)[:500]) for k, v in _flat(config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            client.log_batch(self.run_id, params=params[i:i + 100])
        return {"run_id": self.run_id, "tracking_uri": uri, "experiment": self.experiment}

    def log(self, row, step):
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in _numbers(row).items()])

    def close(self, status):
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, {"finished": "FINISHED", "failed": "FAILED"}.get(status, "KILLED"))
            self.run_id = None


class WandB(Tracker):
    package, extra = "wandb", "wandb"
    # error reporting also gates W&B's OpenTelemetry analytics, which look its server up at exit even offline
    telemetry_off = {"WANDB_ERROR_REPORTING": "false"}

    def __init__(self, project: str = "fedrun", entity: str | None = None, mode: str = "offline"):
        if mode not in ("offline", "online", "disabled"):
            raise ConfigError(f"logger.wandb.mode={mode!r} is not allowed; choose one of: offline, online, disabled")
        self.project, self.entity, self.mode = project, entity, mode
        self.run = None

    def open(self, out_dir, name, config, start, state):
        import wandb

        run_id = state.get("id") if start else None
        self.run = wandb.init(project=self.project, entity=self.entity, mode=self.mode, dir=out_dir, name=name,
                              config=config, id=run_id, resume="allow" if run_id else None, reinit="create_new")
        return {"id": self.run.id}

    def log(self, row, step):
        self.run.log(_numbers(row), step=step)

    def close(self, status):
        if self.run is not None:
            self.run.finish(exit_code=0 if status == "finished" else 1)
            self.run = None


def build(cfg: DictConfig) -> tuple[list[tuple[str, Tracker]], list[str]]:
    """The trackers of `cfg.logger`, built (no package is imported before `open`), and one line per
    tracker that cannot run here (its package missing, its options, its server unreachable)."""
    items, problems = [], []
    for name, node in (cfg.get("logger") or {}).items():
        try:
            cls = get_class(_moved(node._target_))
        except Exception:  # noqa: BLE001 - any failure to find the class
            problems.append(f"logger.{name}._target_={node.get('_target_')!r} is not a class fedrun can import")
            continue
        if cls.package and importlib.util.find_spec(cls.package) is None:
            problems.append(f"logger={name} needs the {cls.package} package, which is not installed: "
                            f"pip install 'fedrun[{cls.extra}]' (or pip install {cls.package})")
            continue
        try:
            tracker = instantiate_checked(node, _target_=_moved(node._target_))
        except ConfigError as e:
            problems.append(str(e))
            continue
        why = tracker.problem() if isinstance(tracker, Tracker) else None
        if why:
            problems.append(why)
        items.append((str(name), tracker))
    return items, problems


def _moved(target) -> str:
    """A tracker's `_target_` as written before the trackers moved into fedrun.run (a user's logger
    yaml, a run's recorded config: `fedrun.trackers.TensorBoard`) names the same class now."""
    target = str(target)
    return "fedrun.run.trackers." + target[len(MOVED_FROM):] if target.startswith(MOVED_FROM) else target


MOVED_FROM = "fedrun.trackers."


def quiet(tracker: Tracker) -> None:
    """Sets `tracker.telemetry_off` in the environment, keeping what the user set."""
    for key, value in getattr(tracker, "telemetry_off", {}).items():
        os.environ.setdefault(key, value)


class Trackers:
    """A run's trackers, opened together: `log` each evaluated round's row, `close` once."""

    def __init__(self, items, out_dir: str, name: str, start: int, config: dict):
        self.items: list[tuple[str, Tracker]] = list(items)
        self.out_dir = out_dir
        path = os.path.join(out_dir, STATE_FILE)
        saved = {}
        if start and os.path.exists(path):
            with open(path) as f:
                saved = json.load(f)
        state = {}
        for k, t in self.items:
            quiet(t)
            try:
                state[k] = t.open(out_dir, name, config, start, saved.get(k, {}))
            except Exception as e:  # noqa: BLE001 - e.g. a tracking URI it cannot reach: one line, exit 2
                self.close("failed")
                first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
                raise ConfigError(f"logger={k} could not start: {first}") from e
        if self.items:
            outputs.write_json(path, state)

    def log(self, row: dict, step: int) -> None:
        for _, t in self.items:
            t.log(row, step)

    def close(self, status: str) -> None:
        for _, t in self.items:
            t.close(status)
