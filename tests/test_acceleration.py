"""compile= and precision= (fedrun.run.acceleration): the compiled local steps give eager's numbers for
every algorithm, resume stays exact under them, each algorithm's `step_uses_round` declaration is
true, bf16 really runs in bfloat16, and the options are checked before any work starts.

torch.compile runs here with backend "aot_eager": Dynamo's capture of each algorithm's step and AOT
autograd, without Inductor's C++ code generation (~30-50 s per step on a 2-core CPU, too slow for
the suite); `fedrun-bench --gpu-check` checks Inductor's compiled steps against eager on CUDA, and
docs/performance.md has the CPU timings of compile=default with Inductor.
"""
from __future__ import annotations

import pytest
import torch
from helpers import fedrun
from torch._dynamo.utils import counters

from fedrun.algorithms import build, names
from fedrun.algorithms.base import flat_clients
from fedrun.config import group_file, load_conf
from fedrun.data import synthetic
from fedrun.engine import VmapEngine, params_of
from fedrun.errors import ConfigError
from fedrun.models import MLP, MLPBN
from fedrun.run.acceleration import LocalSteps, check
from fedrun.simulate import Schedule, local_training, sample_round, simulate


@pytest.fixture(scope="module")
def data():
    # size_factor=1: clients of 45-1,655 rows (the default 5: up to 8,275, whose full-batch MAML
    # test-time steps made most of an eager round's time); the steps' batches are 4 rows either way
    return synthetic(num_clients=8, dim=6, num_classes=3, seed=1, cache_dir=None, chunk_len=16, size_factor=1)


def _model(algo_name: str, **opts):
    torch.manual_seed(0)
    model = MLP(6, 3, hidden=[5])
    try:
        build(algo_name, **opts).check_params(params_of(model))
    except ConfigError:  # FedBN needs BatchNorm
        torch.manual_seed(0)
        model = MLPBN(6, 3, hidden=[5])
    return model


SCHED = Schedule(rounds=2, tau=2, clients_per_round=3, batch_size=4)


def _run(data, algo_name, steps, rounds=2, start=None, **opts):
    model = _model(algo_name, **opts)
    sched = Schedule(**{**SCHED.__dict__, "rounds": rounds})
    out = {}

    def keep(progress):
        out["progress"] = progress

    state, _ = simulate(build(algo_name, **opts), VmapEngine(model), data, params_of(model), sched, 0, start=start,
                        on_checkpoint=keep, steps=steps)
    return state, out["progress"]


def _same(a: dict, b: dict, exact: bool) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if exact:
            assert torch.equal(a[k], b[k]), k
        else:
            torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=k)


# MAML's inner steps, unrolled in the traced step: at most 2 (the agreement test's), the same loop as
# the yaml's 5 (pavg) in a fraction of Dynamo's time (pavg: 66-73 -> 11-23 s here, on the size_factor=1 data above)
INNER_STEPS = 2


# Each algorithm's step is traced anew (~0.5-5 s of Dynamo a case here); FedDyn and PFLScaf add no code to
# trace: their step is DebiasedSGD.client_step with parts the kept cases trace (FedDyn: PFLDyn's terms as
# pfldyn, no adaptation as scaffold; PFLScaf: MAML as pavg, PFLScaf's control variate as scaffold), which
# test_the_debiased_steps_left_out_are_traced_by_the_kept_cases holds true (6.4 + 10.3 s saved).
TRACED_BY = {"feddyn": ("pfldyn", "scaffold"), "pflscaf": ("pavg", "scaffold")}
STEP_PARTS = ("client_step", "client_init", "linear_term", "proximal_term", "logits_embedding", "count_step",
              "batches_per_step")


@pytest.mark.parametrize("algo_name", [n for n in names() if n not in TRACED_BY])
def test_compiled_local_steps_give_eagers_numbers(data, algo_name):
    # one round of 2 steps: the second step runs the compiled code that the first one made (a
    # second round added ~30% to these tests' 70 s of CPU here)
    opts = {"inner_steps": INNER_STEPS} if load_conf(group_file("algo", algo_name)).get("inner_steps",
                                                                                        0) > INNER_STEPS else {}
    eager, _ = _run(data, algo_name, None, rounds=1, **opts)
    counters.clear()
    compiled, _ = _run(data, algo_name, LocalSteps("default", backend="aot_eager"), rounds=1, **opts)
    _same(eager.params, compiled.params, exact=False)
    ce, cc = flat_clients(eager), flat_clients(compiled)
    for k in ce:
        _same(ce[k], cc[k], exact=False)
    # each step is whole graphs (torch.autograd.grad traced into them, fedrun.run.acceleration._one_graph): a
    # graph break re-traces every frame above it (SCAFFOLD's step 70 frames, FedCP's 72), ~3-5x the time
    if hasattr(torch._dynamo.config, "trace_autograd_ops"):
        assert not counters["graph_break"], dict(counters["graph_break"])


def test_the_debiased_steps_left_out_are_traced_by_the_kept_cases():
    for name, kept in TRACED_BY.items():
        algo, others = build(name), [build(k) for k in kept]
        assert name in names() and not set(kept) & set(TRACED_BY)
        for part in STEP_PARTS:  # the same function (or value) as one of the kept cases'
            mine = getattr(type(algo), part, None) if part != "batches_per_step" else algo.batches_per_step
            theirs = [getattr(type(o), part, None) if part != "batches_per_step" else o.batches_per_step
                      for o in others]
            assert mine in theirs, (name, part)
        assert type(algo.adapt) in [type(o.adapt) for o in others], name
        assert type(algo).client_step is type(others[0]).client_step, name


def test_a_resumed_compiled_run_is_bitwise_the_uninterrupted_one(data):
    steps = LocalSteps("default", backend="aot_eager")
    whole, _ = _run(data, "perfedavg", steps, rounds=4)
    _, half = _run(data, "perfedavg", steps, rounds=2)
    resumed, _ = _run(data, "perfedavg", steps, rounds=4, start=half)
    _same(whole.params, resumed.params, exact=True)


def _one_round_step(data, algo_name, rnd, **opts):
    algo = build(algo_name, **opts)
    model = _model(algo_name, **opts)
    state = algo.init(params_of(model), data.num_clients)
    _, trained, idx = sample_round(data, SCHED, algo.batches_per_step, 0, 1, algo.train_all)
    local = algo.client_init(state, trained, 1)
    return local_training(algo, VmapEngine(model), local, data, idx, rnd)


@pytest.mark.parametrize("algo_name,opts", [(n, {}) for n in names()] + [("pfldyn", {"lr_decay": 0.5})])
def test_step_uses_round_is_declared_where_the_step_reads_the_round(data, algo_name, opts):
    """The same inputs at round 1 and round 7: a step that gives other numbers must say
    step_uses_round (compile=graphs would replay round 1's graph otherwise), and one that says so
    must really differ."""
    a, b = _one_round_step(data, algo_name, 1, **opts), _one_round_step(data, algo_name, 7, **opts)
    pa, pb = a.params, b.params
    differs = any(not torch.equal(pa[k], pb[k]) for k in pa)
    assert differs == build(algo_name, **opts).step_uses_round


def test_bf16_autocast_trains_in_bfloat16_with_float32_parameters(data):
    fp32, _ = _run(data, "fedavg", None)
    bf16, _ = _run(data, "fedavg", LocalSteps("none", "bf16"))
    for k in fp32.params:
        assert bf16.params[k].dtype == torch.float32
    # bfloat16 products (8-bit mantissa) move the numbers, but not far: two rounds of 2 steps
    assert any(not torch.equal(fp32.params[k], bf16.params[k]) for k in fp32.params)
    for k in fp32.params:
        torch.testing.assert_close(bf16.params[k], fp32.params[k], rtol=0.05, atol=0.02)


def test_tf32_on_the_cpu_is_fp32(data):
    fp32, _ = _run(data, "fedavg", None)
    tf32, _ = _run(data, "fedavg", LocalSteps("none", "tf32"))
    _same(fp32.params, tf32.params, exact=True)


def test_the_options_are_checked_in_one_line():
    with pytest.raises(ConfigError, match=r"compile='fast' is not allowed; choose one of: none, default, graphs"):
        check("fast", "fp32", "cpu")
    with pytest.raises(ConfigError, match=r"precision='fp16' is not allowed; choose one of: fp32, tf32, bf16"):
        check("none", "fp16", "cpu")
    with pytest.raises(ConfigError, match=r"compile=graphs .* needs a CUDA device"):
        check("graphs", "fp32", "cpu")


def test_precision_on_the_cpu_says_what_it_does(tmp_path):
    """precision=tf32 on the CPU is refused in one line (it would compute fp32 under tf32's name);
    bf16 on the CPU runs, with one warning that it is slower there; on CUDA neither is said."""
    from fedrun.run.acceleration import cpu_note

    with pytest.raises(ConfigError, match=r"^precision=tf32 has no effect on the CPU \(device=cpu\).*precision=fp32$"):
        check("none", "tf32", "cpu")
    check("none", "tf32", "cuda")
    assert cpu_note("bf16", "cuda") is None and cpu_note("fp32", "cpu") is None
    r = fedrun(["precision=tf32", "device=cpu", "rounds=1", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "precision=tf32 has no effect on the CPU" in r.stderr and not (tmp_path / "run").exists()
    r = fedrun(["precision=bf16", "device=cpu", "rounds=1", "data.num_clients=6", "data.seed=9", "tau=2",
                "clients_per_round=3", "progress=false", "plot=false", f"hydra.run.dir={tmp_path / 'bf'}"], tmp_path)
    assert r.returncode == 0, r.stderr
    warned = [line for line in r.stderr.splitlines() if line.startswith("fedrun: warning:")]
    assert warned == [f"fedrun: warning: {cpu_note('bf16', 'cpu')}"] and "slower than fp32" in warned[0]


def test_a_bad_compile_option_stops_the_run_before_it_starts(tmp_path):
    r = fedrun(["compile=graphs", "device=cpu", "rounds=1", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert r.returncode == 2
    assert "compile=graphs captures CUDA graphs and needs a CUDA device" in r.stderr
    assert not (tmp_path / "run").exists()


def _cpu_graph(monkeypatch):
    """compile=graphs's bookkeeping on the CPU: a stand-in for the CUDA graph that, like a replay,
    recomputes from the static inputs into the SAME output tensors."""
    from fedrun.engine.tree import tree_leaves

    def capture(run):
        out = run()

        def replay():
            for a, b in zip(tree_leaves(out), tree_leaves(run())):
                a.copy_(b)
        return replay, out

    monkeypatch.setattr(LocalSteps, "_capture", staticmethod(capture))


def test_graph_replay_refills_its_inputs_and_copies_out_its_outputs(data, monkeypatch):
    _cpu_graph(monkeypatch)
    steps = LocalSteps("graphs")
    eager, _ = _run(data, "perfedavg", None, rounds=3)
    graphed, _ = _run(data, "perfedavg", steps, rounds=3)
    _same(eager.params, graphed.params, exact=True)
    assert steps.captures == 1 and steps._eager_why is None  # one graph served all three rounds


def test_graphs_replay_one_graph_in_rounds_whose_lr_decays(data, monkeypatch, capsys):
    """A round-dependent step (step_uses_round) takes its rate as a tensor refilled before each replay
    (fedrun.algorithms.rates; tests/test_rates.py for every method and schedule)."""
    _cpu_graph(monkeypatch)
    steps = LocalSteps("graphs")
    eager, _ = _run(data, "pfldyn", None, lr_decay=0.5)
    graphed, _ = _run(data, "pfldyn", steps, lr_decay=0.5)
    _same(eager.params, graphed.params, exact=True)
    assert steps.captures == 1 and steps._eager_why is None
    assert "compile=graphs" not in capsys.readouterr().err


def test_every_algorithm_replays_its_graph_to_eagers_numbers(monkeypatch):
    """gpu-check's sweep of compile=graphs over conf/algo, with the CPU stand-in for the graph: each
    algorithm's local state (nested dicts, BatchNorm buffers, per-client counters) goes through the
    static buffers and comes back as eager computed it, or the step says why it runs eagerly."""
    from fedrun.bench.compile import graphs_every_algorithm

    _cpu_graph(monkeypatch)
    rows = graphs_every_algorithm("cpu", small=True)
    assert [r["algo"] for r in rows] == names()
    for r in rows:
        assert "error" not in r, r
        assert r["diff"] == 0.0, r
        assert r["captured"] or r["why"], r
