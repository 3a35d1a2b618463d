"""Experiment trackers (fedrun.run.trackers, conf/logger): `logger=tensorboard` writes event files that
TensorBoard's own reader loads, with every evaluated round's metrics.csv values and the config;
MLflow (local file store) and W&B (offline) runs get the same rows; a resumed run continues its
tracker runs; the batched launcher's jobs log to runs of their own; a missing package is one line,
exit 2, before any work. fedrun runs in this process (helpers.fedrun)."""
import importlib.util
import json

import pandas as pd
import pytest
from helpers import fedrun
from omegaconf import OmegaConf

from fedrun.run.checks import precheck

# 5 clients (data.seed=35), a 6-5-4 DNN: about a second a run
TINY = ["data.num_clients=5", "data.seed=35", "data.dim=6", "data.num_classes=4", "data.chunk_len=64", "model=dnn",
        "model.hidden=[5]", "tau=2", "clients_per_round=3", "batch_size=5", "progress=false", "plot=false"]
METRICS = ("train_loss", "global_acc", "pers_acc", "models_transmitted")


def tensorboard_scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} as TensorBoard itself reads the folder (purged steps left out)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def test_tensorboard_event_files_hold_every_evaluated_round_and_the_config(tmp_path):
    r = fedrun([*TINY, "rounds=4", "eval_every=2", "logger=tensorboard", "hydra.run.dir=run"], tmp_path)
    assert r.returncode == 0, r.stderr
    run = tmp_path / "run"
    csv = pd.read_csv(run / "metrics.csv")
    scalars = tensorboard_scalars(run / "tensorboard")
    assert list(csv["round"]) == [2, 4]
    for col in METRICS:
        assert [s for s, _ in scalars[col]] == [2, 4]
        assert [v for _, v in scalars[col]] == pytest.approx(list(csv[col]), rel=1e-6)  # float32 in the events
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    text = acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "rounds: 4" in text and "_target_: fedrun.run.trackers.TensorBoard" in text


def test_a_resumed_run_continues_its_tensorboard_and_mlflow_runs(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"file:{tmp_path / 'mlruns'}"
    args = [*TINY, "checkpoint_every=2", "logger=[tensorboard,mlflow]", f"logger.mlflow.tracking_uri={uri}",
            "hydra.run.dir=run"]
    assert fedrun([*args, "rounds=3"], tmp_path).returncode == 0
    first = json.loads((tmp_path / "run" / "trackers.json").read_text())["mlflow"]["run_id"]
    # as if killed after round 3's row was logged, before its checkpoint: round 3 is computed again
    (tmp_path / "run" / "checkpoints" / "round_0000003.pt").unlink()
    (tmp_path / "run" / "summary.json").unlink()
    r = fedrun([*args, "rounds=4"], tmp_path)  # more rounds: resumes from round 2's checkpoint
    assert r.returncode == 0 and "resuming from" in r.stderr, r.stderr
    state = json.loads((tmp_path / "run" / "trackers.json").read_text())
    assert state["mlflow"]["run_id"] == first
    csv = pd.read_csv(tmp_path / "run" / "metrics.csv")
    tb = tensorboard_scalars(tmp_path / "run" / "tensorboard")["global_acc"]  # the first round 3 purged
    assert [s for s, _ in tb] == [1, 2, 3, 4] and [v for _, v in tb] == pytest.approx(list(csv["global_acc"]))
    client = MlflowClient(tracking_uri=uri)
    # MLflow keeps every point it was sent: round 3 twice, with the same value (recomputed exactly)
    history = dict(sorted((m.step, m.value) for m in client.get_metric_history(first, "global_acc")))
    assert list(history) == [1, 2, 3, 4] and list(history.values()) == pytest.approx(list(csv["global_acc"]))
    assert len(client.get_metric_history(first, "global_acc")) == 5
    run = client.get_run(first)
    assert run.info.status == "FINISHED" and run.data.params["rounds"] == "3"  # the config it started with
    config = OmegaConf.load(client.download_artifacts(first, "config.yaml", str(tmp_path)))
    assert config.tau == 2 and config.logger.mlflow.experiment == "fedrun"


def test_the_batched_launchers_jobs_log_to_runs_of_their_own(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"file:{tmp_path / 'mlruns'}"
    sweep = tmp_path / "sweep"
    r = fedrun(["-m", *TINY, "rounds=2", "seed=0,1", "hydra/launcher=batched", "logger=[mlflow,tensorboard]",
                f"logger.mlflow.tracking_uri={uri}", f"hydra.sweep.dir={sweep}", "~hydra.callbacks.sweep_report"],
               tmp_path)
    assert r.returncode == 0, r.stderr
    assert not any("logger" in d.name for d in sweep.iterdir())  # trackers stay out of job folder names
    client = MlflowClient(tracking_uri=uri)
    for job in (d for d in sweep.iterdir() if d.is_dir()):
        csv = pd.read_csv(job / "metrics.csv")
        run_id = json.loads((job / "trackers.json").read_text())["mlflow"]["run_id"]
        seed = json.loads((job / "summary.json").read_text())
        assert [m.value for m in sorted(client.get_metric_history(run_id, "pers_acc"), key=lambda m: m.step)] \
            == pytest.approx(list(csv["pers_acc"]))
        assert ([v for _, v in tensorboard_scalars(job / "tensorboard")["pers_acc"]]
                == pytest.approx(list(csv["pers_acc"])))
        assert seed["status"] == "finished"
    runs = {json.loads((d / "trackers.json").read_text())["mlflow"]["run_id"] for d in sweep.iterdir() if d.is_dir()}
    assert len(runs) == 2


def wandb_records(path):
    """The protobuf records of a W&B offline run file (run-<id>.wandb), read as `wandb sync` reads
    them: a 7-byte header, then 32 KiB blocks of records (crc32 4, length 2, type 1: full, or
    first / middle / last pieces of one record)."""
    import struct

    from wandb.proto import wandb_internal_pb2

    raw = open(path, "rb").read()
    assert raw[:4] == b":W&B"
    pos, block, buf = 7, 32768, b""
    while pos + 7 <= len(raw):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos:pos + 7])
        buf += raw[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(buf)
            buf = b""
            yield rec


def test_a_missing_tracker_package_is_one_line_and_exit_2_before_any_work(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    r = fedrun([*TINY, "rounds=2", "logger=[tensorboard,wandb]", "hydra.run.dir=run"], tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "fedrun: error: logger=wandb needs the wandb package, which is not installed: "
        "pip install 'fedrun[wandb]' (or pip install wandb)"]
    assert not (tmp_path / "run" / "metrics.csv").exists() and not (tmp_path / "run" / "tensorboard").exists()


def test_unknown_logger_and_bad_logger_options_are_one_line():
    assert precheck(["logger=tensorbord"]).startswith("logger='tensorbord' is not a known logger; choose one of: "
                                                      "mlflow, tensorboard, wandb")
    assert precheck(["logger=[tensorboard,mlflow]", "logger.mlflow.experiment=x"]) is None


def test_bad_wandb_mode_is_refused_before_any_work(tmp_path):
    r = fedrun([*TINY, "rounds=2", "logger=wandb", "logger.wandb.mode=onlin", "hydra.run.dir=run"], tmp_path)
    assert r.returncode == 2 and "logger.wandb.mode='onlin' is not allowed; choose one of: offline, online, disabled" \
        in r.stderr


def test_a_tracker_that_cannot_start_is_one_line_and_exit_2(tmp_path):
    """An MLflow store that cannot be opened: one line, exit 2; TensorBoard, opened first, is closed."""
    (tmp_path / "blocker").write_text("a file where the store's folder would go")
    r = fedrun([*TINY, "rounds=2", "logger=[tensorboard,mlflow]", f"logger.mlflow.tracking_uri=file:{tmp_path}/blocker",
                "hydra.run.dir=run"], tmp_path)
    assert r.returncode == 2, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("fedrun: error:")]
    assert len(errors) == 1 and errors[0].startswith("fedrun: error: logger=mlflow could not start: "), r.stderr
    assert not (tmp_path / "run" / "metrics.csv").exists()


# A run in a new process with every network lookup and non-local connection refused and recorded:
# the trackers' own telemetry would be the only callers (MLflow's usage telemetry looks up its host
# during the run; W&B's OpenTelemetry analytics, gated by its error reporting, at exit, even offline).
NO_NETWORK = """
import atexit, json, socket, sys
seen = []
atexit.register(lambda: open("network.json", "w").write(json.dumps(seen)))  # first in: runs last
def lookup(host, *args, **kwargs):
    seen.append(f"lookup {host}")
    raise socket.gaierror(socket.EAI_NONAME, "the test allows no network")
real_connect = socket.socket.connect
def connect(self, address):
    if self.family != socket.AF_UNIX:  # (W&B talks to its own service process on a Unix socket)
        seen.append(f"connect {address}")
        raise OSError("the test allows no network")
    return real_connect(self, address)
socket.getaddrinfo, socket.socket.connect = lookup, connect
from fedrun.cli import main
sys.argv = ["fedrun", *sys.argv[1:]]
main()
"""
# the environment variables that would turn the telemetry off without fedrun: CI detection included
# (MLflow turns its telemetry off by itself under pytest or with CI set)
TELEMETRY_ENV = ("MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK", "WANDB_ERROR_REPORTING", "PYTEST_CURRENT_TEST", "CI",
                 "GITHUB_ACTIONS", "GITLAB_CI", "JENKINS_URL", "TRAVIS", "CIRCLECI", "BUILDKITE", "TF_BUILD",
                 "TEAMCITY_VERSION", "BITBUCKET_BUILD_NUMBER", "CODEBUILD_BUILD_ARN", "MLFLOW_TRACKING_URI")


def no_network_run(tmp_path):
    """`tmp_path` after a 2-round run with MLflow and W&B (offline) in it, in a new process that allows no network."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in TELEMETRY_ENV}
    env.update(FEDRUN_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1", WANDB_SILENT="true")
    r = subprocess.run([sys.executable, "-c", NO_NETWORK, *TINY, "rounds=2", "logger=[mlflow,wandb]",
                        "hydra.run.dir=run"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return tmp_path


def test_a_run_with_each_tracker_opens_no_network_connection_and_wandb_gets_the_rows(tmp_path):
    """One process for both checks (a module fixture would run once per xdist worker: ~11 CPU-s each)."""
    no_network_run(tmp_path)
    assert set(json.loads((tmp_path / "run" / "trackers.json").read_text())) == {"mlflow", "wandb"}
    assert json.loads((tmp_path / "network.json").read_text()) == []
    check_wandb_offline_run_gets_the_rows_and_the_config(tmp_path)


def check_wandb_offline_run_gets_the_rows_and_the_config(tmp_path):
    """The W&B offline run of the no-network process (`no_network_run`): the rows of metrics.csv and the config."""
    run = tmp_path / "run"
    run_id = json.loads((run / "trackers.json").read_text())["wandb"]["id"]
    offline, = (run / "wandb").glob(f"offline-run-*-{run_id}")
    history, config = [], {}
    for rec in wandb_records(offline / f"run-{run_id}.wandb"):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "run":
            config.update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.run.config.update})
    csv = pd.read_csv(run / "metrics.csv")
    assert [h["_step"] for h in history] == list(csv["round"])
    assert [h["global_acc"] for h in history] == pytest.approx(list(csv["global_acc"]))
    rounds = config["rounds"]
    assert (rounds["value"] if isinstance(rounds, dict) else rounds) == 2


def test_an_unreachable_mlflow_server_is_one_line_before_any_work_and_leaves_no_folder(tmp_path):
    """Checked with one connection and a short timeout before the run: without the check MLflow retries
    for minutes (here its retries are cut to none, so that the run would start and leave its folder)."""
    import socket

    with socket.socket() as s:  # a port nothing listens on: the connection is refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = fedrun([*TINY, "rounds=2", "logger=mlflow", f"logger.mlflow.tracking_uri=http://127.0.0.1:{port}",
                "hydra.run.dir=run"], tmp_path, env={"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"})
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"fedrun: error: logger.mlflow.tracking_uri='http://127.0.0.1:{port}' cannot be reached (Connection refused; "
        "waited up to 5 s): start the MLflow server or fix the address; logger.mlflow.tracking_uri=null (and no "
        "MLFLOW_TRACKING_URI) logs to ./mlruns offline"]
    assert not (tmp_path / "run").exists()


def test_a_tracker_target_from_before_the_run_wing_still_builds():
    """The trackers moved from fedrun/trackers.py into fedrun/run/ (issue 47): a logger yaml written
    before (a user's, or a run's recorded config) names `fedrun.trackers.<Class>`, and builds the same
    class; a target that names nothing is still refused in one line."""
    from fedrun.run import trackers

    cfg = OmegaConf.create({"logger": {"tb": {"_target_": "fedrun.trackers.TensorBoard", "dir": "tb"},
                                       "new": {"_target_": "fedrun.run.trackers.TensorBoard"}}})
    items, problems = trackers.build(cfg)
    assert problems == [] and [(k, type(t), t.dir) for k, t in items] == [
        ("tb", trackers.TensorBoard, "tb"), ("new", trackers.TensorBoard, "tensorboard")]
    _, problems = trackers.build(OmegaConf.create({"logger": {"x": {"_target_": "fedrun.trackers.Nothing"}}}))
    assert problems == ["logger.x._target_='fedrun.trackers.Nothing' is not a class fedrun can import"]
