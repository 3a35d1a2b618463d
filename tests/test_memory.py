"""memory= (fedrun/run/memory.py): the planner measures, chunks within a budget, and falls back.

The budget is ENFORCED: `AllocationMeter(limit)` counts the bytes of every tensor the run allocates
and raises torch.OutOfMemoryError past `limit`, as a device of that size would. Proved here, on the
CPU and without timing:
  - the plan made from the probes' measured costs chunks both the training (clients at once) and the
    full passes (row chunks per call), and the whole run then stays inside the enforced budget (no
    allocation is refused: the probes' costs extrapolate to the real rounds);
  - the all-at-once run does not fit that budget (allocations are refused) and the out-of-memory
    fallback (halving clients, halving full-pass chunks) still completes it;
  - all three runs give the same numbers (parameters within rtol 1e-6, atol 1e-7; metrics rel 1e-5);
  - a budget that cannot hold one client stops with one line naming the model, the batch and the
    budget, from the command line before the run folder is made.
"""
import dataclasses
import os

import pytest
import torch
from helpers import fedrun

import fedrun.simulate as sim
from fedrun.algorithms import build, names
from fedrun.algorithms.base import Algorithm
from fedrun.algorithms.perfedavg import PerFedAvg
from fedrun.data import synthetic
from fedrun.engine import VmapEngine, params_of
from fedrun.engine.tree import tree_map
from fedrun.errors import ConfigError
from fedrun.models import MLP
from fedrun.run import memory
from fedrun.simulate import Schedule, simulate

SCHED = Schedule(rounds=2, tau=2, clients_per_round=8, batch_size=200)


@pytest.fixture(autouse=True)
def one_thread():  # (as the suite's xdist workers run; -n 0 would use every core for these tiny products)
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return synthetic(num_clients=8, seed=1, size_factor=1, cache_dir=str(tmp_path_factory.mktemp("c")), chunk_len=32)


def _setup(data):
    torch.manual_seed(0)
    model = MLP(data.in_features, data.num_classes, hidden=[64])
    return PerFedAvg(variant="fo"), VmapEngine(model), params_of(model)


def _run(data, budget=None, limit=None, monkeypatch=None):
    """A run planned for `budget` bytes (None: unplanned, all at once), under an enforced `limit`
    (None: none). Returns the final state, the last evaluation, the plan, the meter, the engine and
    the clients of every local-training call."""
    algo, engine, params = _setup(data)
    plan = memory.plan(algo, engine, data, SCHED, params, 0, budget, what="model=mlp") if budget else None
    sizes = []
    real = sim.local_training

    def spy(algo_, engine_, local, data_, idx, *args):
        sizes.append(idx.shape[0])
        return real(algo_, engine_, local, data_, idx, *args)

    monkeypatch.setattr(sim, "local_training", spy)
    with memory.AllocationMeter(limit) as meter:
        state, last = simulate(algo, engine, data, params, SCHED, 0, start_chunk=plan.clients if plan else None)
    monkeypatch.undo()
    return state, last, plan, meter, engine, sizes


def _same(a, b):
    for k in a[0].params:
        torch.testing.assert_close(a[0].params[k], b[0].params[k], rtol=1e-6, atol=1e-7)
    assert a[1].row == pytest.approx(b[1].row, rel=1e-5, abs=1e-6)


def test_plan_fits_an_enforced_budget_and_the_fallback_recovers(data, monkeypatch):
    whole = _run(data, monkeypatch=monkeypatch)
    algo, engine, params = _setup(data)
    costs = memory.plan(algo, engine, data, SCHED, params, 0, 2**40)  # no limit in reach: costs only
    assert costs.clients is None and costs.chunks is None and costs.train_per_client > 0 and costs.eval_per_chunk > 0
    # room for ~3 of the dearer unit: fewer clients than the round's 8, fewer chunks than a split's
    budget = int(costs.resident + 3 * max(costs.train_per_client, costs.eval_per_chunk) / memory.FILL)
    limit = budget - memory.tensor_bytes(data.train, data.test)  # (the data was allocated before the meter)

    fitted = _run(data, budget, limit, monkeypatch)
    plan, meter, engine = fitted[2], fitted[3], fitted[4]
    assert 1 <= plan.clients < 8 and 1 <= plan.chunks < len(data.train.chunk_idx)
    assert set(fitted[5]) == {plan.clients, 8 % plan.clients} - {0}  # every round in planned chunks
    assert meter.refused == 0 and meter.peak <= limit and engine.max_chunks == plan.chunks
    _same(whole, fitted)

    # planned for a device it does not have: all at once is refused, the halving finishes the run
    fallback = _run(data, 2**40, limit, monkeypatch)
    assert fallback[3].refused > 0 and fallback[3].peak <= limit
    assert fallback[5][0] == 8 and min(fallback[5]) < 8 and fallback[4].max_chunks < len(data.train.chunk_idx)
    _same(whole, fallback)

    with pytest.raises(ConfigError) as e:  # not even one client
        memory.plan(algo, engine, data, SCHED, params, 0, costs.resident + 1000, what="model=mlp")
    line = str(e.value)
    assert "\n" not in line and "model=mlp" in line and "batch_size=200" in line and "memory=" in line


def test_a_budget_too_small_for_one_client_stops_before_the_run_folder(tmp_path):
    out = tmp_path / "run"
    r = fedrun(["data.num_clients=6", "data.seed=9", "rounds=2", "tau=2", "clients_per_round=3",
                           "progress=false", "plot=false", "memory=0.000001", f"hydra.run.dir={out}"], tmp_path)
    code, err = r.returncode, r.stderr
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "model=" in err and "batch_size=" in err and "memory=1e-06 " in err
    assert not os.path.exists(out)


def test_gpu_check_memory_part_runs_on_the_cpu(capsys):
    """`fedrun-bench --gpu-check --gpu-check-parts memory` at tiny sizes on the CPU (the caps enforced by
    AllocationMeter): the CIFAR ACID preset and ResNet-18 on generated CIFAR-100 files (Dirichlet 0.1),
    all at once and under a cap, one table, exit 0."""
    from fedrun.bench import cli as bench

    with pytest.raises(SystemExit) as e:
        bench.main(["--gpu-check", "--gpu-check-device", "cpu", "--gpu-check-parts", "memory"])
    out = capsys.readouterr().out
    assert e.value.code == 0, out
    table = out[out.index("part "):].splitlines()[1:-1]
    assert [" ".join(line.split()[:4]) for line in table] == [
        "memory cifar_acid all at", "memory cifar_acid 0.15 GB", "memory resnet18 c100 all",
        "memory resnet18 c100 0.15"]
    assert "ERROR" not in out and "generated CIFAR-100 files" in out and "x all-at-once" in out


def test_memory_is_not_part_of_a_runs_fingerprint():
    """A run resumes under another memory= (fedrun.run.resume.fingerprint drops NEUTRAL_OPTIONS); by hand,
    docs/performance.md: 2 rounds at memory=0.003 resumed to 4 at 0.002 wrote the metrics.csv of 4
    uninterrupted rounds at 0.002, byte for byte, and of 4 unplanned rounds."""
    from fedrun.bench.fitted import _compose
    from fedrun.run.resume import fingerprint

    prints = [fingerprint(_compose(o)) for o in (["memory=8"], ["memory=auto"], ["memory=0.5", "tau=3"])]
    assert prints[0] == prints[1] != prints[2]


DBE = Schedule(rounds=1, tau=2, clients_per_round=2, batch_size=200)


@pytest.fixture(scope="module")
def many(tmp_path_factory):  # 24 training clients, 2 a round: FedDBE's prepare is the run's dearest part
    return synthetic(num_clients=24, seed=1, size_factor=1, cache_dir=str(tmp_path_factory.mktemp("c")), chunk_len=32)


def _feddbe(data):
    torch.manual_seed(0)
    model = MLP(data.in_features, data.num_classes, hidden=[64])
    return build("feddbe"), VmapEngine(model), params_of(model)


def test_feddbe_prepare_trains_every_client_in_the_planned_chunks(many):
    """FedDBE's round before round 1 trains all 24 training clients where a round trains 2: it goes in
    the round's chunks (EvalContext.chunked), which the plan sizes for it too, so the run stays inside
    the enforced budget; all at once it is refused there and the halving finishes it; the global mean
    and the model are those of the unplanned run, bit for bit (on the CPU)."""
    algo, engine, params = _feddbe(many)
    whole, _ = simulate(algo, engine, many, params, DBE, 0)
    costs = memory.plan(algo, engine, many, DBE, params, 0, 2**40)
    # room for ~6 clients' training (and for the global model's full pass, which the probes do not cover)
    budget = int(costs.resident + 6 * costs.train_per_client / memory.FILL)
    limit = budget - memory.tensor_bytes(many.train, many.test)  # (the data was allocated before the meter)
    algo, engine, params = _feddbe(many)
    plan = memory.plan(algo, engine, many, DBE, params, 0, budget, what="model=mlp")
    assert DBE.clients_per_round <= plan.clients < many.num_train_clients  # the round whole, prepare in chunks
    with memory.AllocationMeter(limit) as meter:
        fitted, _ = simulate(algo, engine, many, params, DBE, 0, start_chunk=plan.clients)
    assert meter.refused == 0 and meter.peak <= limit

    algo, engine, params = _feddbe(many)
    with memory.AllocationMeter(limit) as meter:  # unplanned under the same cap: refused, then halved
        halved, _ = simulate(algo, engine, many, params, DBE, 0)
    assert meter.refused > 0 and meter.peak <= limit
    for state in (fitted, halved):
        assert torch.equal(state.extra["global_mean"], whole.extra["global_mean"])
        for k in whole.params:
            assert torch.equal(state.params[k], whole.params[k]), k


def test_prepare_chunked_by_hand_equals_all_at_once(data):
    """FedDBE.prepare with 1 and 3 clients at a time (ChunkedTraining.map, as simulate passes it) gives
    the global mean of all at once, bit for bit, and holds less at its peak."""
    algo, engine, params = _feddbe(data)
    means, peaks = [], []
    for size in (None, 1, 3):
        ctx = dataclasses.replace(sim.eval_context(data, DBE, 0, 0), chunked=sim.ChunkedTraining(size).map)
        with memory.AllocationMeter() as meter:
            state = algo.prepare(engine, algo.init(params, data.num_clients), ctx)
        means.append(state.extra["global_mean"])
        peaks.append(meter.peak)
    assert torch.equal(means[0], means[1]) and torch.equal(means[0], means[2])
    assert peaks[1] < peaks[2] < peaks[0]


def _mlp(data):
    torch.manual_seed(0)
    model = MLP(data.in_features, data.num_classes, hidden=[64])
    return VmapEngine(model), params_of(model)


def test_the_probes_train_the_runs_own_round(data):
    """The plan probes with the algorithm bound to the run, as the round loop binds it: a
    fresh FedFomo's probes take the run's tau=3 training steps (its phase sized by the run's tau) after
    its weighing step, as its round 1 does."""
    sched = Schedule(rounds=1, tau=3, clients_per_round=4, batch_size=20)
    seen = []

    def spy(algo, engine, local, data_, idx, rnd, aug=None):
        seen.append(tuple(d.idx.shape[1] for d in idx))  # (a round of phases: a PhaseDraw each)
        return sim.local_training(algo, engine, local, data_, idx, rnd, aug)

    engine, params = _mlp(data)
    memory.plan(build("fedfomo"), engine, data, sched, params, 0, 2**40, steps=spy)
    probed = set(seen)
    seen.clear()
    simulate(build("fedfomo"), engine, data, params, sched, 0, steps=spy)
    assert probed == set(seen) == {(1, 3)}


@pytest.mark.parametrize("name", [n for n in names() if type(build(n)).prepare is not Algorithm.prepare])
def test_prepare_sets_values_not_shapes(data, name):
    """Why the plan may probe on `init`'s state, before `prepare` (docs/performance.md, "When the probes
    run"): every algorithm's prepare returns tensors of the shapes, dtypes and devices init made."""
    engine, params = _mlp(data)
    algo = build(name)
    state = algo.init(params, data.num_clients)
    ready = algo.prepare(engine, state, sim.eval_context(data, SCHED, 0, 0))

    def meta(s):
        return tree_map(lambda v: (v.shape, v.dtype, v.device), (s.params, s.extra, s.clients))
    assert meta(ready) == meta(state)
