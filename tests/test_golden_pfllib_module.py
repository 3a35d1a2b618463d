"""fedrun `protocol=official` against golden traces of PFLlib's methods with parts beside the model or
feature alignment: FedPAC and GPFL.

scripts/golden/record_pfllib_module.py ran PFLlib's own client class and server methods on the tiny
problem of the other PFLlib traces (tests/test_golden_pfllib.py, whose helpers this reuses) with
every pass over a client's rows a recorded shuffle. Each test composes the fedrun config saying what
the recorder's PFLlib arguments said, feeds it the same initial weights, clients and passes (by
replacing `fedrun.simulate.sample_phases`) and checks, after every round, the server's body, every
client's head and the global prototypes (FedPAC), the CoV and the GCE (GPFL),
|fedrun - PFLlib| <= ATOL + RTOL |PFLlib| (float32). Also: FedPAC's QP solver by value, and both
methods' state through batched seeds and a checkpoint.
"""
from __future__ import annotations

import pytest
import torch
from test_golden_pfedme import golden_data
from test_golden_pfllib import (
    NAMES,
    Worst,
    batched_and_resumed,
    load,
    official_cfg,
    padded_passes,
    replay_rounds,
    replay_setup,
)

import fedrun.simulate
from fedrun.engine import ENGINES

# algo -> (fedrun options for the trace's args, which recorded passes feed each of fedrun's phases)
OPTIONS = {
    "fedpac": lambda a: ["algo.lr=0.1", f"algo.lam={a['lamda']}", "algo.head_epochs=1",
                         f"algo.local_epochs={a['local_epochs']}"],
    "gpfl": lambda a: ["algo.lr=0.1", f"algo.lam={a['lamda']}", f"algo.mu={a['mu']}",
                       f"algo.local_epochs={a['local_epochs']}"],
}


def fedpac_passes(b: dict, a: dict) -> list[list]:
    """FedPAC's phases (statistics, head, body, prototypes) from a client's recorded passes: its
    statistics_extraction's feature pass (the 2nd of 3), then train()'s head pass, body passes and
    collect_protos' pass."""
    E = a["local_epochs"]
    train = b["train"]
    assert len(b["stats"]) == 3 and len(train) == 2 + E
    return [[b["stats"][1]], [train[0]], train[1:1 + E], [train[1 + E]]]


def gpfl_passes(b: dict, a: dict) -> list[list]:
    """GPFL's phases (class count, training) from a client's recorded train() passes: the count
    pass walks the first of them (any pass counts every row: the clients' rows divide by 4)."""
    assert len(b["train"]) == a["local_epochs"]
    return [b["train"][:1], b["train"]]


PASSES = {"fedpac": fedpac_passes, "gpfl": gpfl_passes}
COV = {f"Conditional_{p}.{i}.{w}": f"{p}.{n}{w}" for p in ("gamma", "beta") for i, n in (("0", ""), ("2", "ln."))
       for w in ("weight", "bias")}


def replay(trace: dict, extra: list[str] = (), engine: str = "vmap") -> list:
    a, algo = trace["args"], trace["algorithm"]
    cfg = official_cfg(algo, OPTIONS[algo](a), a, 1, engine, extra)
    data, algorithm, model, params = replay_setup(trace, cfg)
    its = trace["iterations"]

    def sample_phases(data, sched, phases, seed, rnd, train_all=False):
        it, longest = its[rnd - 1], int((data.train.sizes // sched.batch_size).max())
        per_client = [PASSES[algo](it["batches"][str(c)], a) for c in it["selected"]]
        out = []
        for j, ph in enumerate(phases):
            parts = [padded_passes(p[j], ph.epochs, longest, int(data.train.offsets[c]))
                     for p, c in zip(per_client, it["selected"])]
            assert all(len(p[j]) == ph.epochs for p in per_client)
            out.append(fedrun.simulate.PhaseDraw(
                torch.tensor([p[0] for p in parts]).view(len(parts), -1, 1, sched.batch_size),
                torch.tensor([p[1] for p in parts])))
        clients = torch.tensor(it["selected"])
        return clients, clients, tuple(out)

    if "modules" in trace:  # GPFL's CoV and GCE start from PFLlib's
        m = trace["modules"]
        algorithm.init_modules = lambda p: {"cov": {COV[k]: torch.tensor(v) for k, v in m["cov"].items()},
                                            "gce": torch.tensor(m["gce"]["embedding.weight"])}
    return replay_rounds(cfg, algorithm, ENGINES[cfg.engine](model), data, params, sample_phases=sample_phases)


def compare(trace: dict, states: list) -> Worst:
    """name -> worst |d| - ATOL - RTOL |ref| over every compared entry (> 0: a mismatch)."""
    worst = Worst()
    close = worst.close
    for it, state in worst.rounds(trace, states):  # (PFLlib's server holds the body alone)
        part = state.clients.part
        for c, models in it["clients"].items():
            for name, v in models.items():
                if NAMES[name] in part:
                    close("head", v, part[NAMES[name]][int(c)])
        if "gce" in it:
            close("gce", it["gce"]["embedding.weight"], state.extra["gce"])
            for k, v in it["cov"].items():
                close("cov", v, state.extra["cov"][COV[k]])
        if "protos" in it:
            present = state.extra["present"]
            assert sorted(int(k) for k in it["protos"]) == torch.nonzero(present).view(-1).tolist()
            for k, v in it["protos"].items():
                close("protos", v, state.extra["protos"][int(k)])
    return worst


def test_fedpac_replays_pfllib_and_the_paper_rule_does_not():
    """FedPAC (follow=pfllib under protocol=official): the body, every client's combined head and the
    global prototypes after every round. follow=paper (prototypes weighted by the
    clients' class counts, and every head combined from the trained heads, not PFLlib's in-place
    sequence) moves the prototypes, the heads, and through the alignment term the body."""
    trace = load("fedpac")
    worst = compare(trace, replay(trace))
    assert set(worst) == {"server", "head", "protos"} and all(v <= 0 for v in worst.values()), worst
    paper = compare(trace, replay(trace, ["algo.follow=paper"]))
    assert paper["protos"] > 0 and paper["head"] > 0 and paper["server"] > 0


def test_fedpac_head_weights_solve_its_quadratic_program():
    """`simplex_qp` against the closed form of two clients, a^T P a at its answer not above that of
    any of 2000 random points of the simplex (10 clients, some weights 0), and the threshold EPS."""
    from fedrun.algorithms.fedpac import EPS, head_weights, simplex_qp

    P = torch.tensor([[[2.0, 0.5], [0.5, 1.0]], [[1.0, 3.0], [3.0, 10.0]]], dtype=torch.float64)
    a = simplex_qp(P)
    assert torch.allclose(a[0], torch.tensor([0.25, 0.75], dtype=torch.float64), atol=1e-15)
    assert torch.equal(a[1], torch.tensor([1.0, 0.0], dtype=torch.float64))  # the minimum at a vertex
    g = torch.Generator().manual_seed(0)
    M = torch.randn(3, 10, 3, generator=g, dtype=torch.float64)
    P = M @ M.transpose(1, 2) + torch.diag_embed(torch.rand(3, 10, generator=g, dtype=torch.float64)) * 0.1
    a = simplex_qp(P)
    assert (a >= 0).all() and torch.allclose(a.sum(-1), torch.ones(3, dtype=torch.float64)) and (a == 0).any()
    trial = torch.distributions.Dirichlet(torch.full((10,), 0.3, dtype=torch.float64)).sample((2000,))
    value = lambda x, p: ((x @ p) * x).sum(-1)
    for i in range(3):
        assert value(a[i], P[i]) <= value(trial, P[i]).min() + 1e-12
    # statistics far apart, one client with tiny variance: its own head; EPS drops the rest
    A = head_weights(torch.tensor([1e-6, 1.0, 1.0]), torch.tensor([[[0.0]], [[5.0]], [[-5.0]]]))
    assert A[0, 0] > 1 - EPS and (A[0, 1:] == 0).all()


def test_gpfl_replays_pfllib_and_the_paper_rule_does_not():
    """GPFL (follow=pfllib under protocol=official): the body, every client's head, the CoV and the
    GCE after every round. follow=paper (the conditions from the received global GCE, from the first
    round on) moves them all."""
    trace = load("gpfl")
    worst = compare(trace, replay(trace))
    assert set(worst) == {"server", "head", "gce", "cov"} and all(v <= 0 for v in worst.values()), worst
    paper = compare(trace, replay(trace, ["algo.follow=paper"]))
    assert paper["head"] > 0 and paper["cov"] > 0


@pytest.mark.parametrize("name,opts", [("fedpac", {"local_epochs": 1}), ("gpfl", {"follow": "pfllib"})])
def test_state_survives_batched_seeds_and_a_checkpoint_and_resume(tmp_path, name, opts):
    """Two seeds trained as one computation give each seed's own run, and 2 rounds, a checkpoint
    written and read back, then 1 more give the 3 rounds straight, bit for bit: the server's model,
    every per-client state (heads; GPFL's condition embeddings) and the extra state (FedPAC's
    prototypes, GPFL's CoV and GCE). FedPAC in epochs, GPFL in tau steps (the other forms' state is
    the same)."""
    from fedrun.algorithms import build
    from fedrun.engine import params_of
    from fedrun.models import MLP
    from fedrun.simulate import Schedule

    data = golden_data()
    sched = Schedule(rounds=3, tau=3, clients_per_round=2, batch_size=4, eval_every=3)
    torch.manual_seed(0)
    model = MLP(12, 4, hidden=[8])
    batched_and_resumed(build(name, lr=0.1, **opts), model, data, params_of(model), sched, tmp_path)
