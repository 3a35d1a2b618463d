"""Seeds as a batch dimension (fedrun.run.runner, hydra/launcher=batched): a group of seeds run as one
computation writes, per seed, what the seed run alone writes; a sweep through the launcher gives
every job its folder and fedrun-report summarizes them; a half-finished batched sweep resumes.

Tolerance: metrics.csv and clients.csv values agree within 2e-6 absolute (their 6-decimal format
carries ~1e-6; the stacked computation may round differently from a run's own in the last float bits).
"""
import csv
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch
from helpers import fedrun
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from fedrun.algorithms.adaptation import ADAPTATIONS
from fedrun.algorithms.fedavg import FedAvg
from fedrun.config import CONF_DIR
from fedrun.data import synthetic
from fedrun.engine import VmapEngine, params_of
from fedrun.models import MLP
from fedrun.report import build
from fedrun.run.runner import group_key, run_jobs
from fedrun.simulate import Diverged, Replica, Schedule, simulate, simulate_group

TOL = 2e-6
# 5 clients with 1,330 training rows (data.seed=35), 6 features, 4 classes, a 6-5-4 DNN: seconds per case.
TINY = ["data.num_clients=5", "data.seed=35", "data.dim=6", "data.num_classes=4", "data.chunk_len=64", "model=dnn",
        "model.hidden=[5]", "rounds=2", "tau=2", "clients_per_round=3", "batch_size=5", "progress=false", "plot=false",
        "checkpoint_every=0"]


def _cases() -> list[list[str]]:
    """Every algorithm config in conf/algo; for the paper-004 ones also their other adaptation; for
    those with protocol-dependent options (null: the protocol decides) also protocol=official."""
    cases = []
    for name in sorted(f[:-5] for f in os.listdir(os.path.join(CONF_DIR, "algo")) if f.endswith(".yaml")):
        algo = OmegaConf.load(os.path.join(CONF_DIR, "algo", f"{name}.yaml"))
        cases.append([f"algo={name}"] + (["model=mlp_bn", "model.hidden=[10]"] if name == "fedbn" else [])  # BatchNorm
                     + (["algo.head_steps=1"] if "head_steps" in algo else []))  # a body step in tau=2 (else refused)
        if "adaptation" in algo:
            # "none" is what conf/algo's feddyn and scaffold run already
            cases += [[f"algo={name}", f"algo.adaptation={a}"] for a in ADAPTATIONS if a not in (algo.adaptation,
                                                                                                 "none")]
        if any(algo[k] is None for k in ("mu", "personalized", "train_all", "test_time") if k in algo):
            cases.append([f"algo={name}", "protocol=official"])
    # rows drawn without replacement (pfedme official: every client trains, the sampled ones first)
    cases += [["algo=feddyn", "sampling=epochs"], ["algo=pfedme", "protocol=official", "sampling=steps"]]
    return cases


def configs(overrides: list[str], seeds, cache: str) -> list:
    """The composed config once per seed (composed once: composing is the slow part)."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=[*TINY, f"cache_dir={cache}", *overrides])  # later wins
    out = []
    for s in seeds:
        c = cfg.copy()
        c.seed = s
        out.append(c)
    return out


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One data cache for the module: the tiny dataset is generated once."""
    return str(tmp_path_factory.mktemp("cache"))


def table(path: str) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def assert_same_tables(a: str, b: str) -> None:
    ra, rb = table(a), table(b)
    assert len(ra) == len(rb) and ra and list(ra[0]) == list(rb[0])
    for x, y in zip(ra, rb):
        for k in x:
            # (an infinite loss, e.g. FedProto's on rows of a class without a global prototype, equals itself)
            assert x[k] == y[k] or abs(float(x[k]) - float(y[k])) <= TOL, (a, k, x[k], y[k])


@pytest.mark.parametrize("overrides", _cases(), ids=lambda o: ",".join(v.split("=", 1)[1] for v in o))
def test_seeds_batched_equal_the_seeds_run_alone(overrides, tmp_path, cache):
    seeds = (0, 1, 2) if overrides == ["algo=pfedme", "protocol=official"] else (0, 1)
    cfgs = configs(overrides, seeds, cache)
    assert len({group_key(c) for c in cfgs}) == 1  # one configuration, so one group
    batched = run_jobs([(c, str(tmp_path / f"batched{c.seed}")) for c in cfgs])
    assert all(r["status"] == "finished" for r in batched)
    for c in cfgs:
        run_jobs([(c, str(tmp_path / f"alone{c.seed}"))])
        for name in ("metrics.csv", "clients.csv"):
            assert_same_tables(str(tmp_path / f"batched{c.seed}" / name), str(tmp_path / f"alone{c.seed}" / name))
    if len(seeds) == 3:  # max_group=2: seeds 0 and 1 together, then seed 2 alone
        run_jobs([(c, str(tmp_path / f"split{c.seed}")) for c in cfgs], max_group=2)
        for c in cfgs:
            assert_same_tables(str(tmp_path / f"split{c.seed}" / "metrics.csv"),
                               str(tmp_path / f"alone{c.seed}" / "metrics.csv"))
    # the seeds really differ (a mix-up of replicas could not go unnoticed)
    assert table(str(tmp_path / "batched0" / "metrics.csv")) != table(str(tmp_path / "batched1" / "metrics.csv"))


def test_a_half_finished_batched_sweep_resumes_to_the_same_files(tmp_path, cache):
    """Seed 0 finished, seed 1 stopped at its round-2 checkpoint, seed 2 never started: the relaunch
    skips seed 0 and trains seeds 1 (from round 2) and 2 (from 0) together, replicas joining the loop
    at their own rounds; every metrics.csv equals the uninterrupted batched run's byte for byte."""
    full = configs(["algo=pflscaf", "rounds=4", "checkpoint_every=2"], (0, 1, 2), cache)
    ref = [str(tmp_path / "ref" / str(c.seed)) for c in full]
    run_jobs(list(zip(full, ref)))
    out = [str(tmp_path / "sweep" / str(c.seed)) for c in full]
    shutil.copytree(ref[0], out[0])
    half = configs(["algo=pflscaf", "rounds=2", "checkpoint_every=2"], (1,), cache)[0]
    run_jobs([(half, out[1])])
    assert json.load(open(os.path.join(out[1], "summary.json")))["rounds"] == 2
    results = run_jobs(list(zip(full, out)))
    assert [r["status"] for r in results] == ["finished"] * 3
    assert results[0] == json.load(open(os.path.join(ref[0], "summary.json")))  # skipped, not rerun
    for r, o in zip(ref, out):
        assert open(os.path.join(o, "metrics.csv"), "rb").read() == open(os.path.join(r, "metrics.csv"), "rb").read()


def test_sweep_with_the_batched_launcher_writes_every_job_and_reports(tmp_path, cache):
    sweep = tmp_path / "sweep"
    args = [*TINY, "algo=fedavg", "seed=0,1", "tau=2,3", "hydra/launcher=batched", f"hydra.sweep.dir={sweep}"]
    r = fedrun(["-m", *args], tmp_path, {"FEDRUN_CACHE": cache})  # (a real process: the ctrl_c test below)
    assert r.returncode == 0, r.stderr
    jobs = sorted(j for j in os.listdir(sweep) if (sweep / j).is_dir())
    assert [j.split("_")[0] for j in jobs] == ["0", "1", "2", "3"]
    for j in jobs:
        files = set(os.listdir(sweep / j))
        assert {"metrics.csv", "clients.csv", "partition.csv", "summary.json", "checkpoints", ".hydra"} <= files
        assert {"config.yaml", "hydra.yaml", "overrides.yaml"} <= set(os.listdir(sweep / j / ".hydra"))
        assert json.load(open(sweep / j / "summary.json"))["rounds"] == 2
        assert json.load(open(sweep / j / "summary.json"))["status"] == "finished"
    _, groups, summary = build([str(sweep)])
    assert len(groups) == 2 and list(summary["n_seeds"]) == [2, 2]


def test_the_batched_launcher_applies_hydra_job_env_set(tmp_path):
    """A job's hydra.job.env_set is in the environment while it trains, as under the basic launcher,
    over the value the process had, which comes back afterwards: here FEDRUN_CACHE (conf's cache_dir
    reads it) sends the generated data to the folder it names. (In this process: the launcher's
    discovery in a real one is test_a_ctrl_c_inside_a_batched_round_stops_every_seed_after_it's.)"""
    sweep, env_cache, own = tmp_path / "sweep", tmp_path / "env_cache", tmp_path / "cache"
    args = ["-m", *TINY, "algo=fedavg", "seed=0,1", "hydra/launcher=batched", f"hydra.sweep.dir={sweep}",
            f"+hydra.job.env_set.FEDRUN_CACHE={env_cache}"]
    before = os.environ.get("FEDRUN_CACHE")
    r = fedrun(args, tmp_path, {"FEDRUN_CACHE": str(own)})  # the process's own value: tmp_path/cache
    assert r.returncode == 0, r.stderr
    assert env_cache.is_dir() and any(env_cache.iterdir())
    assert not own.exists() and not (tmp_path / ".cache").exists()
    assert os.environ.get("FEDRUN_CACHE") == before
    for j in ("0", "1"):
        job = next(d for d in sweep.iterdir() if d.name.split("_")[0] == j)
        assert json.load(open(job / "summary.json"))["status"] == "finished"


@pytest.mark.parametrize("launcher", ["basic", "batched"])
def test_a_sweep_with_a_refused_job_stops_before_any_job_trains(tmp_path, launcher):
    """fedbn then pavg on a BatchNorm model: P-Avg (adaptation=maml) refuses BatchNorm layers (docs/baselines.md).
    The sweep stops with that one line, naming the job, before job 0 trains; no sweep folder is left."""
    sweep = tmp_path / "sweep"
    r = fedrun(["-m", *TINY, "algo=fedbn,pavg", "model=mlp_bn", f"hydra/launcher={launcher}",
                f"hydra.sweep.dir={sweep}"], tmp_path)
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("fedrun: error: algo=pavg with algo.adaptation=maml does not handle BatchNorm layers")
    assert ("(sweep job: " in line and "model=mlp_bn" in line.split("(sweep job: ")[1]
            and "refused before its batch" in line)
    assert "algo=pavg" in line.split("(sweep job: ")[1] and "algo=fedbn" not in line
    assert not sweep.exists() and "outputs in" not in r.stdout


def test_a_refused_rerun_into_a_finished_sweep_leaves_its_folder_as_it_was(tmp_path):
    """Hydra rewrites multirun.yaml when a sweep begins; when fedrun then refuses a job, the old one
    is put back (else fedrun-report would list jobs of the refused sweep as missing)."""
    sweep = tmp_path / "sweep"
    assert fedrun(["-m", *TINY, "seed=0,1", f"hydra.sweep.dir={sweep}"], tmp_path).returncode == 0
    before = {p.relative_to(sweep): p.read_bytes() for p in sweep.rglob("*") if p.is_file()}
    r = fedrun(["-m", *TINY, "algo=fedbn,pavg", "seed=0,1,2", "model=mlp_bn", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert r.returncode == 2 and "refused before its batch started" in r.stderr
    assert {p.relative_to(sweep): p.read_bytes() for p in sweep.rglob("*") if p.is_file()} == before


def test_what_the_sweep_cannot_check_before_its_jobs_is_left_to_them(tmp_path):
    """${hydra:job.num} resolves only inside a job, and a job's env_set only while it runs: such
    sweeps run as before (the pre-check neither crashes nor refuses on the sweep process's values)."""
    sweep = tmp_path / "sweep"
    r = fedrun(["-m", *TINY, "seed=${hydra:job.num}", "tau=1,2", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(json.loads(p.read_text())["seed"] for p in sweep.glob("*/summary.json")) == [0, 1]
    afile, folder = tmp_path / "afile", tmp_path / "cache_here"
    afile.write_text("not a folder")
    r = fedrun(["-m", *TINY, "seed=0", f"+hydra.job.env_set.FEDRUN_CACHE={folder}",
                f"hydra.sweep.dir={tmp_path / 's2'}"],
               tmp_path, {"FEDRUN_CACHE": str(afile)})
    assert r.returncode == 0, r.stderr
    assert folder.is_dir()


def test_a_diverging_seed_stops_alone_and_the_group_goes_on():
    data = synthetic(num_clients=5, dim=6, num_classes=4, seed=35, chunk_len=64)
    torch.manual_seed(0)
    model = MLP(6, 4, hidden=[5])
    sched = Schedule(rounds=2, tau=2, clients_per_round=3, batch_size=5)
    nan = {k: torch.full_like(v, float("nan")) for k, v in params_of(model).items()}
    runs = [Replica(0, params_of(model)), Replica(1, nan), Replica(2, params_of(model))]
    simulate_group(FedAvg(), VmapEngine(model), data, runs, sched)
    assert runs[0].error is None and runs[2].error is None and isinstance(runs[1].error, Diverged)
    assert "round 1" in str(runs[1].error)
    _, alone = simulate(FedAvg(), VmapEngine(model), data, params_of(model), sched, 2)
    assert runs[2].last.row == pytest.approx(alone.row, abs=1e-6)
    assert runs[2].at.round == 2 and runs[1].at.round == 0


def test_the_batched_launcher_gives_each_job_one_thread_unless_told(tmp_path, cache, monkeypatch):
    """threads=auto: one torch thread per job under the batched launcher; threads=N sets N and
    threads=default restores torch's own (here pinned to 2). Jobs run in this order in one process,
    so each job's count is its own setting, not the one before it left."""
    from helpers import fedrun

    monkeypatch.setattr("fedrun.device.TORCH_THREADS", 2)
    sweep = tmp_path / "sweep"
    args = ["-m", *TINY, "algo=fedavg", "seed=0", "threads=3,auto,default", "hydra/launcher=batched",
            f"hydra.sweep.dir={sweep}", "~hydra.callbacks.sweep_report"]
    r = fedrun(args, tmp_path, env={"FEDRUN_CACHE": cache})
    assert r.returncode == 0, r.stderr
    # each job trains with its own config (the thread counts below differ per job)
    threads = {}
    for job in (d for d in sweep.iterdir() if d.is_dir()):  # threads is left out of the folder names
        option = next(o for o in OmegaConf.load(job / ".hydra" / "overrides.yaml") if o.startswith("threads="))
        threads[option.split("=")[1]] = json.loads((job / "summary.json").read_text())["threads"]
    assert threads == {"3": 3, "auto": 1, "default": 2}


# A sweep stopped at a chosen point in a new process: fedrun.cli with RunFolder.log_row wrapped so that,
# at its NTH call for round RND, the process sends itself SIGINT (issue 46: a Ctrl-C inside a round).
_STOP_AT = """
import os, signal, sys
import fedrun.run.folder
rnd, nth = (int(v) for v in os.environ['STOP_AT'].split(':'))
calls, log_row = [], fedrun.run.folder.RunFolder.log_row
def stop(self, row):
    log_row(self, row)
    if row['round'] == rnd:
        calls.append(self.path)
        if len(calls) == nth:
            os.kill(os.getpid(), signal.SIGINT)
fedrun.run.folder.RunFolder.log_row = stop
from fedrun.cli import main
sys.argv[0] = 'fedrun'
main()
"""
STOPPED = [*TINY, "rounds=4", "checkpoint_every=1", "seed=0,1", "hydra/launcher=batched",
           "~hydra.callbacks.sweep_report"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, cache) -> list[str]:
    """The job folders of the sweep STOPPED, run to its end."""
    ref = tmp_path_factory.mktemp("uninterrupted")
    r = fedrun(["-m", *STOPPED, f"hydra.sweep.dir={ref / 'sweep'}"], ref, {"FEDRUN_CACHE": cache})
    assert r.returncode == 0, r.stderr
    return _jobs(ref / "sweep")


def _jobs(sweep) -> list[str]:
    return sorted(str(sweep / j) for j in os.listdir(sweep) if (sweep / j).is_dir())


def _last_checkpoint(job: str) -> dict:
    folder = os.path.join(job, "checkpoints")
    return torch.load(os.path.join(folder, sorted(os.listdir(folder))[-1]), weights_only=True)


def _resume_as_uninterrupted(sweep, uninterrupted: list[str], cwd, cache: str) -> list[str]:
    """Reruns the sweep STOPPED into `sweep`: its seeds resume from one round, and every job's
    metrics.csv, clients.csv and final parameters equal the uninterrupted sweep's byte for byte.
    Returns the rounds they resumed from."""
    r = fedrun(["-m", *STOPPED, f"hydra.sweep.dir={sweep}"], cwd, {"FEDRUN_CACHE": cache})
    assert r.returncode == 0, r.stderr
    resumed = [line.rsplit("(round ", 1)[1] for line in r.stderr.splitlines() if line.startswith("fedrun: resuming")]
    assert len(resumed) == 2 and len(set(resumed)) == 1, r.stderr  # the group resumed from one round
    jobs = _jobs(sweep)
    for j, ref in zip(jobs, uninterrupted, strict=True):
        for name in ("metrics.csv", "clients.csv"):
            assert open(os.path.join(j, name), "rb").read() == open(os.path.join(ref, name), "rb").read(), (j, name)
        a, b = _last_checkpoint(j)["state"]["params"], _last_checkpoint(ref)["state"]["params"]
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), j
    return resumed


def test_a_ctrl_c_inside_a_batched_round_stops_every_seed_after_it(tmp_path, cache, uninterrupted):
    """Ctrl-C while seed 1 logs round 2, after seed 0 finished it: the interrupt waits for the round's
    end, so both seeds keep round 2 (before: seed 0 at round 2, seed 1 at round 1), and the rerun
    resumes both from it to the uninterrupted sweep's files. This file's one batched sweep in a new
    process: Hydra finds the launcher in hydra_plugins/ there (the other sweeps run in this one)."""
    sweep = tmp_path / "sweep"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "FEDRUN_CACHE": cache, "OMP_NUM_THREADS": "1", "STOP_AT": "2:2",
           "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    p = subprocess.run([sys.executable, "-c", _STOP_AT, "-m", *STOPPED, f"hydra.sweep.dir={sweep}"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300,
                       # a shell's background job starts with SIGINT ignored, and its children inherit that
                       # (then the SIGINT never stops the sweep): the terminal's default here
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert p.returncode == 130, p.stderr
    assert [_last_checkpoint(j)["round"] for j in _jobs(sweep)] == [2, 2], p.stderr
    assert p.stderr.count("interrupted after round 2") == 2, p.stderr
    assert _resume_as_uninterrupted(sweep, uninterrupted, tmp_path, cache) == ["2)", "2)"]


def test_seeds_a_kill_left_at_different_rounds_resume_from_their_common_round(tmp_path, cache, uninterrupted):
    """What a SIGKILL between seed 0's and seed 1's round-2 checkpoints leaves (each write is atomic,
    the two are not): both logged round 2, seed 0 keeps rounds 1 and 2, seed 1 only round 1, no
    summary. The rerun takes seed 0 back to round 1 with seed 1 (before: seed 0 went on from 2,
    alone in its rounds), to the uninterrupted sweep's files."""
    sweep = tmp_path / "sweep"
    shutil.copytree(os.path.dirname(uninterrupted[0]), sweep)
    for job in _jobs(sweep):  # the sweep as it stood during round 2's checkpoints
        folder = os.path.join(job, "checkpoints")
        for f in os.listdir(folder):
            os.remove(os.path.join(folder, f))
        for f in ("summary.json", "clients.csv"):
            os.remove(os.path.join(job, f))
        with open(os.path.join(job, "metrics.csv")) as f:
            kept = [line for line in f if not line.startswith(("3,", "4,"))]
        with open(os.path.join(job, "metrics.csv"), "w") as f:
            f.writelines(kept)
    r = fedrun(["-m", *STOPPED, "rounds=2", f"hydra.sweep.dir={tmp_path / 'two'}"], tmp_path, {"FEDRUN_CACHE": cache})
    assert r.returncode == 0, r.stderr
    for job, two in zip(_jobs(sweep), _jobs(tmp_path / "two"), strict=True):
        shutil.copytree(os.path.join(two, "checkpoints"), os.path.join(job, "checkpoints"), dirs_exist_ok=True)
    os.remove(os.path.join(_jobs(sweep)[1], "checkpoints", "round_0000002.pt"))
    assert _resume_as_uninterrupted(sweep, uninterrupted, tmp_path, cache) == ["1)", "1)"]


def test_a_group_checkpoints_its_seeds_at_the_same_rounds():
    """A time-based checkpoint (checkpoint_minutes) that falls due for one seed is every seed's: a
    group's checkpoints always name common rounds (before: each seed its own clock's rounds)."""
    data = synthetic(num_clients=5, dim=6, num_classes=4, seed=35, chunk_len=64)
    torch.manual_seed(0)
    model = MLP(6, 4, hidden=[5])
    saved: dict[int, list[int]] = {0: [], 1: []}
    due = {0: lambda: len(saved[0]) == 0, 1: lambda: False}  # seed 0 due after round 1, seed 1 never
    runs = [Replica(s, params_of(model), on_checkpoint=lambda at, s=s: saved[s].append(at.round), checkpoint_due=due[s])
            for s in (0, 1)]
    sched = Schedule(rounds=3, tau=1, clients_per_round=2, batch_size=5)
    simulate_group(FedAvg(), VmapEngine(model), data, runs, sched)
    assert saved == {0: [1, 3], 1: [1, 3]}


def test_seeds_at_different_rounds_without_a_common_checkpoint_resume_from_their_own(tmp_path, capsys):
    """Where a seed lacks the group's common round's checkpoint (none written there), the seeds keep
    their own resume points, and one line says so."""
    from types import SimpleNamespace

    from fedrun.run.runner import _resume_together

    spec = SimpleNamespace(output=SimpleNamespace(resume="auto"), fingerprint={})
    jobs = [SimpleNamespace(spec=spec, ck={"round": r, "path": "p"}, out_dir=str(tmp_path / str(r))) for r in (4, 2)]
    _resume_together(jobs)
    assert [j.ck["round"] for j in jobs] == [4, 2]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stopped at rounds [2, 4]" in err and "round 2" in err, err


def test_a_job_builds_its_algorithm_and_model_once(tmp_path, cache, monkeypatch):
    """RunSpec.from_config is the one pass: each job of a group builds its algorithm and its model once
    (checked, then trained), not again in the runner (e300027: the algorithm twice, the model three times)."""
    built = {"algo": 0, "model": 0}

    def counting(cls, key):
        init = cls.__init__

        def counted(self, *a, **k):
            built[key] += 1
            init(self, *a, **k)
        monkeypatch.setattr(cls, "__init__", counted)

    counting(FedAvg, "algo")
    counting(MLP, "model")
    jobs = [(c, str(tmp_path / f"s{c.seed}")) for c in configs(["algo=fedavg"], [0, 1], cache)]
    assert all(isinstance(r, dict) and r["status"] == "finished" for r in run_jobs(jobs))
    assert built == {"algo": 2, "model": 2}
