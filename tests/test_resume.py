"""Runs that survive: exact resume after SIGKILL, corrupt checkpoints, NaN guard, validation, chunking.

Only the runs that get killed are new processes; every other run is the CLI in this process
(helpers.fedrun)."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from helpers import fedrun, write_mnist_idx

import fedrun.simulate as sim
from fedrun import outputs
from fedrun.algorithms.perfedavg import PerFedAvg
from fedrun.data import synthetic
from fedrun.engine import VmapEngine, params_of
from fedrun.models import MLP
from fedrun.simulate import Diverged, Schedule, simulate

# data.seed=9: 3,780 synthetic rows for 10 clients (the default seed 0 draws 52,795; nothing here
# depends on the data, and evaluating every client each round is most of a round's time).
# ROUNDS: the killed runs are killed after 25-35 rounds; the rest is margin for the kill to land.
ROUNDS = 100
RUN = ["data.num_clients=10", "data.seed=9", f"rounds={ROUNDS}", "tau=10", "clients_per_round=5", "checkpoint_every=10",
       "progress=false", "plot=false"]


def start(args, cwd):
    env = {**os.environ, "FEDRUN_CACHE": str(cwd / "cache"), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "fedrun.cli", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(args, cwd):
    r = fedrun(args, cwd)
    return r.returncode, r.stdout, r.stderr


def rows(path):
    try:
        with open(path) as f:
            return max(0, sum(1 for _ in f) - 1)
    except FileNotFoundError:
        return 0


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run to compare against."""
    cwd = tmp_path_factory.mktemp("ref")
    code, _, err = finish([*RUN, f"hydra.run.dir={cwd / 'run'}"], cwd)
    assert code == 0, err
    return (cwd / "run" / "metrics.csv").read_bytes()


def kill_midway(args, run_dir, cwd, min_rows=25):
    p = start(args, cwd)
    deadline = time.time() + 300
    while time.time() < deadline and p.poll() is None:
        if rows(run_dir / "metrics.csv") >= min_rows and outputs.checkpoint_paths(str(run_dir / "checkpoints")):
            break
        time.sleep(0.005)
    assert p.poll() is None, "the run ended before it could be killed; make it longer"
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert p.returncode == -signal.SIGKILL
    n = rows(run_dir / "metrics.csv")
    assert 0 < n < ROUNDS
    return n


def test_sigkill_then_rerun_resumes_to_identical_metrics(tmp_path, reference):
    run_dir = tmp_path / "run"
    args = [*RUN, f"hydra.run.dir={run_dir}"]
    kill_midway(args, run_dir, tmp_path)
    lines = (run_dir / "metrics.csv").read_text().splitlines()
    assert all(l.count(",") == lines[0].count(",") for l in lines)  # no torn row
    code, out, err = finish(args, tmp_path)
    assert code == 0, err
    assert "resuming from" in err
    assert (run_dir / "metrics.csv").read_bytes() == reference
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "finished"
    # the same command once more: finished, so skipped, nothing rewritten
    before = (run_dir / "metrics.csv").stat().st_mtime_ns
    code, out, err = finish(args, tmp_path)
    assert code == 0 and "already finished" in out
    assert (run_dir / "metrics.csv").stat().st_mtime_ns == before


def test_corrupt_newest_checkpoint_falls_back_to_previous(tmp_path, reference):
    """The checkpoints of a run that stopped at round 30 (in this process: the killed run is
    test_sigkill_then_rerun_resumes_to_identical_metrics's), the newest torn; the same run for all
    its rounds resumes from the one before and ends as the uninterrupted run did."""
    run_dir = tmp_path / "run"
    args = [*RUN, f"hydra.run.dir={run_dir}"]
    code, _, err = finish([a if not a.startswith("rounds=") else "rounds=30" for a in args], tmp_path)
    assert code == 0, err
    paths = outputs.checkpoint_paths(str(run_dir / "checkpoints"))
    assert [os.path.basename(p) for p in paths] == ["round_0000030.pt", "round_0000020.pt"]
    with open(paths[0], "r+b") as f:  # truncate the newest checkpoint to half its size
        f.truncate(os.path.getsize(paths[0]) // 2)
    code, _, err = finish(args, tmp_path)
    assert code == 0, err
    assert f"checkpoint {paths[0]} is unreadable" in err and "resuming from " + paths[1] in err
    assert (run_dir / "metrics.csv").read_bytes() == reference


def test_all_checkpoints_corrupt_is_a_clear_error(tmp_path):
    ck = tmp_path / "run" / "checkpoints"
    ck.mkdir(parents=True)
    (ck / "round_0000010.pt").write_bytes(b"garbage")
    code, _, err = finish([*RUN, "rounds=20", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert code == 2
    assert "no readable checkpoint" in err and "resume=false" in err and "Traceback" not in err


def test_resume_with_a_different_config_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    code, _, err = finish([*RUN, "rounds=10", f"hydra.run.dir={run_dir}"], tmp_path)
    assert code == 0, err
    code, _, err = finish([*RUN, "rounds=20", "tau=3", f"hydra.run.dir={run_dir}"], tmp_path)
    assert code == 2 and "different configuration" in err and "tau: 10 -> 3" in err
    # more rounds with the same settings continue the run
    code, _, err = finish([*RUN, "rounds=20", f"hydra.run.dir={run_dir}"], tmp_path)
    assert code == 0 and "resuming from" in err
    assert rows(run_dir / "metrics.csv") == 20


def test_resume_from_an_explicit_path_and_resume_false(tmp_path):
    first = tmp_path / "first"
    code, _, err = finish([*RUN, "rounds=10", f"hydra.run.dir={first}"], tmp_path)
    assert code == 0, err
    code, _, err = finish([*RUN, "rounds=20", f"resume={first}", f"hydra.run.dir={tmp_path / 'second'}"], tmp_path)
    assert code == 0 and "resuming from" in err and rows(tmp_path / "second" / "metrics.csv") == 20
    code, _, err = finish([*RUN, "rounds=20", "resume=false", f"hydra.run.dir={first}"], tmp_path)
    assert code == 0 and "resuming" not in err and (first / "metrics.csv.previous").exists()


# ------------------------------------------------------------------- divergence guard

@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return synthetic(num_clients=8, seed=1, cache_dir=str(tmp_path_factory.mktemp("c")), chunk_len=64)


class NaNOnRound3(PerFedAvg):
    """Per-FedAvg that corrupts the update of the third client of round 3."""

    calls = 0

    def client_step(self, engine, local, batches, rnd):
        out = super().client_step(engine, local, batches, rnd)
        self.calls += 1
        if self.calls == 2 * 2 + 1:  # tau=2: rounds 1-2 take steps 1-4; step 5 opens round 3
            params = {k: v.clone() for k, v in out.params.items()}
            params["net.0.weight"][2, 0, 0] = float("nan")
            out = out._replace(params=params)
        return out


def test_nan_in_a_client_update_is_caught_with_round_and_client(data):
    torch.manual_seed(0)
    model = MLP(data.in_features, data.num_classes, hidden=[8])
    sched = Schedule(rounds=5, tau=2, clients_per_round=4, batch_size=5)
    seen = []
    with pytest.raises(Diverged, match=r"round 3: perfedavg produced NaN/inf parameters on clients \[\d+\]") as e:
        simulate(NaNOnRound3(), VmapEngine(model), data, params_of(model), sched, 0, on_eval=lambda r, t,
                 ev: seen.append(r))
    assert seen == [1, 2]
    clients, _, _ = sim.sample_round(data, sched, 2, 0, 3)
    assert f"[{int(clients[2])}]" in str(e.value)


def test_divergence_stops_or_is_recorded(tmp_path):
    args = [*RUN, "rounds=5", "algo.beta=1e30", "algo.alpha=1e30"]
    code, _, err = finish([*args, f"hydra.run.dir={tmp_path / 'a'}"], tmp_path)
    assert code == 3 and "fedrun: error: round" in err and "NaN/inf" in err and "Traceback" not in err
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["status"] == "diverged"
    code, _, err = finish([*args, "on_diverge=record", f"hydra.run.dir={tmp_path / 'b'}"], tmp_path)
    assert code == 0 and "diverged (recorded" in err
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["status"] == "diverged" and "round" in summary["error"]


# ------------------------------------------------------------------- validation

@pytest.mark.parametrize("args, expected", [
    (["algo.beta=-0.1"], ["algo.beta=-0.1 must be a number > 0"]),
    (["algo.alpha=abc"], ["algo.alpha='abc' must be a number >= 0"]),
    (["algo.beta=inf"], ["algo.beta=inf must be a finite number > 0"]),  # passed the check, then diverged
    (["algo.alpha=nan"], ["algo.alpha=nan must be a finite number >= 0"]),
    (["data.num_clients=0"], ["data.num_clients=0: allowed an integer >= 1"]),  # the data preset's own check
    (["data.train_frac=1.5"], ["data.train_frac=1.5: allowed strictly between 0 and 1"]),
    (["checkpoint_every=-1"], ["checkpoint_every=-1 must be an integer >= 0"]),
    (["on_diverge=ignore"], ["on_diverge='ignore' is not allowed; choose one of: stop, record"]),
    (["batch_size=2.5"], ["batch_size=2.5 must be an integer >= 1"]),
    (["resume=/no/such/dir"], ["resume='/no/such/dir': no such file or folder"]),
    (["model.activation=swish"], ["model.activation='swish' is not one of"]),
    (["tau=0", "rounds=-3", "frac=2", "algo.variant=so"],
     ["rounds=-3 must be", "tau=0 must be", "frac=2 must be", "algo.variant='so' is not allowed"]),
])
def test_each_invalid_option_gets_its_line(tmp_path, args, expected):
    code, _, err = finish([*RUN, *args, f"hydra.run.dir={tmp_path / 'v'}"], tmp_path)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == len(expected), err
    for want in expected:
        assert any(l.startswith("fedrun: error: ") and want in l for l in lines), (want, err)
    assert not (tmp_path / "v" / "metrics.csv").exists()


def test_mnist_a_too_large_names_the_largest_that_fits(tmp_path):
    import numpy as np

    write_mnist_idx(str(tmp_path / "mn"), np.repeat(np.arange(10), 30), np.repeat(np.arange(10), 10))
    code, _, err = finish([*RUN[2:], "rounds=2", "data=mnist_perfedavg", f"data.root={tmp_path / 'mn'}", "data.n=4",
                           "data.a=20", f"hydra.run.dir={tmp_path / 'v'}"], tmp_path)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "data.a=20 with data.n=4 needs" in err and "the largest a that fits is" in err


# ------------------------------------------------------------------- client chunks

def _train(data, client_chunk, monkeypatch=None):
    torch.manual_seed(0)
    model = MLP(data.in_features, data.num_classes, hidden=[8])
    sched = Schedule(rounds=3, tau=3, clients_per_round=7, batch_size=5)
    state, last = simulate(PerFedAvg(variant="hf"), VmapEngine(model), data, params_of(model), sched, 0,
                           client_chunk=client_chunk)
    return state, last


def test_chunked_round_equals_unchunked(data):
    a, ev_a = _train(data, None)
    b, ev_b = _train(data, 3)
    for k in a.params:
        torch.testing.assert_close(a.params[k], b.params[k], rtol=1e-6, atol=1e-7)
    assert ev_a.row == pytest.approx(ev_b.row, rel=1e-5, abs=1e-6)


def test_out_of_memory_splits_clients_automatically(data, monkeypatch):
    real = sim.local_training
    sizes = []

    def small_device(algo, engine, local, data_, idx, rnd, aug=None):
        sizes.append(idx.shape[0])
        if idx.shape[0] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB (simulated)")
        return real(algo, engine, local, data_, idx, rnd, aug)

    a, _ = _train(data, None)
    monkeypatch.setattr(sim, "local_training", small_device)
    b, _ = _train(data, None)
    assert sizes[:3] == [7, 4, 2]  # 7 fails, 4 fails, then chunks of 2 for the rest of the run
    assert max(sizes[3:]) == 2
    for k in a.params:
        torch.testing.assert_close(a.params[k], b.params[k], rtol=1e-6, atol=1e-7)


def test_relaunched_sweep_skips_finished_jobs_and_resumes_the_rest(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", "algo=fedavg,perfedavg", *RUN, "rounds=10", "checkpoint_every=5", f"hydra.sweep.dir={sweep}"]
    code, out, err = finish(args, tmp_path)
    assert code == 0, err
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and (p / "metrics.csv").exists())
    assert len(jobs) == 2
    first = [(j / "metrics.csv").read_bytes() for j in jobs]
    # make job 1 look interrupted after round 5: no summary, no round-10 checkpoint
    (jobs[1] / "summary.json").unlink()
    assert outputs.checkpoint_paths(str(jobs[1] / "checkpoints"))[0].endswith("round_0000010.pt")
    os.remove(outputs.checkpoint_paths(str(jobs[1] / "checkpoints"))[0])
    code, out, err = finish(args, tmp_path)
    assert code == 0, err
    assert out.count("already finished") == 1 and err.count("resuming from") == 1 and "round_0000005.pt" in err
    assert [(j / "metrics.csv").read_bytes() for j in jobs] == first


def test_valid_frac_does_not_repeat_other_problems(tmp_path):
    code, _, err = finish([*RUN, "rounds=0", "frac=0.5", f"hydra.run.dir={tmp_path / 'v'}"], tmp_path)
    assert code == 2 and err.strip().splitlines() == ["fedrun: error: rounds=0 must be an integer >= 1"]


ABSENT = object()


def test_a_checkpoint_from_before_an_option_existed_still_matches():
    from fedrun.run.resume import ADDED_OPTIONS, _diff

    def nest(path, leaf, base):  # {"a": {"b": leaf}} for path "a.b", beside base's keys at the deepest level
        *parents, name = path.split(".")
        d = {**base, name: leaf} if leaf is not ABSENT else dict(base)
        for p in reversed(parents):
            d = {p: d}
        return {**d, "seed": 0}

    for key, value in ADDED_OPTIONS.items():
        base = {"x": 0.02}
        old = nest(key, ABSENT, base)
        assert _diff(old, nest(key, value, base)) == []
        shown = "null" if value is None else value
        assert _diff(old, nest(key, "other", base)) == [
            f"{key}: 'other', but the checkpoint is from before that option and computed {key}={shown}"]
        assert _diff(nest(key, "other", base), nest(key, ABSENT, base)) != []  # only that way round


@pytest.mark.parametrize("overrides", [[], ["data=cifar10_acid"], ["dataset=cifar10", "partition=dirichlet"],
                                       ["dataset=fmnist", "partition=shards"]])
def test_a_checkpoint_from_before_data_became_dataset_x_partition_still_matches(overrides):
    """Run folders written before the data renovation (old data targets; a partition picked by its
    `name`; a dataset node without `_target_`) resume: their settings, put back into that old shape,
    upgrade to today's fingerprint; a changed option is still a difference."""
    from hydra import compose, initialize_config_dir

    from fedrun.config import CONF_DIR
    from fedrun.run.resume import RENAMED_TARGETS, _diff, fingerprint, upgrade

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        now = fingerprint(compose("config", overrides=overrides))
    old = json.loads(json.dumps(now))
    back = {new: was for was, new in RENAMED_TARGETS.items()}
    old["data"]["_target_"] = back.get(old["data"]["_target_"], old["data"]["_target_"])
    for where in (old, old["data"]):
        if isinstance(where.get("partition"), dict):
            name = overrides[1].split("=")[1]
            where["partition"] = {"name": name, **{k: v for k, v in where["partition"].items() if k != "_target_"}}
        if isinstance(where.get("dataset"), dict):
            where["dataset"] = {k: v for k, v in where["dataset"].items() if k != "_target_"}
    assert old != now and _diff(old, now) != []
    assert _diff(upgrade(old), now) == []
    if "partition" in old:
        old["partition"]["seed"] = 1
        assert _diff(upgrade(old), now) == ["partition.seed: 1 -> 0"]
def test_a_run_folder_from_before_the_yamls_named_the_module_resumes(tmp_path):
    """Run folders written before conf/algo's `_target_` named the module (e300027 and older: a
    checkpoint's settings say `fedrun.algorithms.LocalOnly`, today's yaml
    `fedrun.algorithms.local.LocalOnly`) resume; another algorithm's short target is still a difference."""
    from fedrun.run.resume import _diff, upgrade

    run_dir = tmp_path / "run"
    code, _, err = finish([*RUN, "algo=local", "rounds=1", f"hydra.run.dir={run_dir}"], tmp_path)
    assert code == 0, err
    (path,) = outputs.checkpoint_paths(str(run_dir / "checkpoints"))
    ck = torch.load(path, weights_only=True)
    now = ck["config"]
    assert now["algo"]["_target_"] == "fedrun.algorithms.local.LocalOnly"
    ck["config"] = {**now, "algo": {**now["algo"], "_target_": "fedrun.algorithms.LocalOnly"}}
    torch.save(ck, path)
    code, _, err = finish([*RUN, "algo=local", "rounds=2", f"hydra.run.dir={run_dir}"], tmp_path)
    assert code == 0 and "resuming from" in err, err
    assert rows(run_dir / "metrics.csv") == 2
    other = {**now, "algo": {**now["algo"], "_target_": "fedrun.algorithms.FedAvg"}}
    assert _diff(upgrade(other), now) == ["algo._target_: 'fedrun.algorithms.fedavg.FedAvg' -> "
                                          "'fedrun.algorithms.local.LocalOnly'"]


def test_resume_with_momentum_is_byte_identical(tmp_path):
    """Each client's momentum buffer persists across rounds in the checkpoint (optim.state=persist):
    2 rounds, then resumed to 4, write the metrics of 4 rounds in one go. A cosine schedule's length
    is the run's rounds, so more rounds is another run."""
    opt = ["algo=fedavg", "optim.momentum=0.9", "optim.nesterov=true", "optim.weight_decay=5e-4", "checkpoint_every=1"]
    code, _, err = finish([*RUN, *opt, "rounds=4", f"hydra.run.dir={tmp_path / 'whole'}"], tmp_path)
    assert code == 0, err
    for rounds in (2, 4):
        code, _, err = finish([*RUN, *opt, f"rounds={rounds}", f"hydra.run.dir={tmp_path / 'halves'}"], tmp_path)
        assert code == 0, err
    assert "resuming from" in err
    assert (tmp_path / "halves" / "metrics.csv").read_bytes() == (tmp_path / "whole" / "metrics.csv").read_bytes()
    code, _, err = finish([*RUN, *opt, "rounds=6", "optim.schedule=cosine", f"hydra.run.dir={tmp_path / 'whole'}"],
                          tmp_path)
    assert code == 2 and "different configuration" in err and "optim" in err


def test_schedules_over_the_runs_rounds_are_part_of_the_fingerprint():
    """FedPHP's mu_t (mu_rounds null: the run's rounds) and APPLE's lam_t (decay_rounds null: decay x
    rounds) follow `rounds`: a run resumed with more rounds would continue on another schedule than its
    first rounds took, so the resolved value is in the fingerprint and such a resume is refused; pinned,
    or for an algorithm without such a schedule, more rounds still resume."""
    from hydra import compose, initialize_config_dir

    from fedrun.config import CONF_DIR
    from fedrun.run.resume import _diff, fingerprint

    def fp(*overrides):
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            return fingerprint(compose("config", overrides=list(overrides)))

    assert _diff(fp("algo=fedphp", "rounds=4"), fp("algo=fedphp", "rounds=8"))
    assert _diff(fp("algo=apple", "rounds=10"), fp("algo=apple", "rounds=20"))  # decay 0.1: L = 1, then 2 rounds
    assert not _diff(fp("algo=fedphp", "algo.mu_rounds=4", "rounds=4"),
                     fp("algo=fedphp", "algo.mu_rounds=4", "rounds=8"))
    assert not _diff(fp("algo=apple", "algo.decay_rounds=3", "rounds=4"),
                     fp("algo=apple", "algo.decay_rounds=3", "rounds=8"))
    assert not _diff(fp("algo=fedavg", "rounds=4"), fp("algo=fedavg", "rounds=8"))
