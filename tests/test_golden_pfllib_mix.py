"""fedrun `protocol=official` against golden traces of PFLlib's model-mixing methods (FedAMP, FedPHP),
recorded by scripts/golden/record_pfllib_mix.py from PFLlib's own client and server classes on the
problem of tests/test_golden_pfllib.py, whose replay (the same clients and minibatches fed to
`fedrun.simulate`) this reuses. Checked after every round, within its tolerances (float32, RTOL, ATOL):
FedAMP every client's model and its cloud model u_i (the attention-weighted mixture the server sent);
FedPHP the server model, every client's model and its historical model.
"""
from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
import test_golden_pfllib as base
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from test_golden_pfedme import golden_data
from test_golden_pfllib import ATOL, RTOL, load

import fedrun.simulate
from fedrun.algorithms.base import client_entries
from fedrun.config import CONF_DIR
from fedrun.engine import ENGINES
from fedrun.run.protocol import apply_protocol
from fedrun.run.spec import schedule, validate

OPTIONS = {
    "fedamp": lambda a: ["algo.lr=0.1", f"algo.lam={a['lamda']}", f"algo.alpha_k={a['alphaK']}",
                         f"algo.sigma={a['sigma']}"],
    "fedphp": lambda a: ["algo.lr=0.1", f"algo.mu={a['mu']}", f"algo.lam={a['lamda']}",
                         f"algo.mu_rounds={a['global_rounds']}"],
    "fedala": None,  # replay_fedala
}
# trace field -> where fedrun keeps it ("server": state.params, else the per-client entry name)
FIELDS = {
    "fedamp": {"clients": "params", "cloud": "u"},
    "fedphp": {"server": "server", "clients": "params", "historical": "historical"},
    "fedala": {"server": "server", "clients": "params", "weights": "weights"},
}
# fields compared for the round's selected clients only: PFLlib's FedPHP sends the global model into
# EVERY client's `model` at the round's start, fedrun keeps each client's last personalized model
SELECTED_ONLY = {("fedphp", "clients")}


def replay(trace: dict, extra: list[str] = (), engine: str = "vmap") -> list:
    if trace["algorithm"] == "fedala":
        return replay_fedala(trace, extra, engine)
    with mock.patch.dict(base.OPTIONS, OPTIONS):
        return base.replay(trace, extra, engine)


def replay_fedala(trace: dict, extra: list[str] = (), engine: str = "vmap") -> list:
    """FedALA's rounds of phases (ALA pass, ALA start passes, training steps) fed PFLlib's minibatches:
    its ALA walks each client's rows in order (rand_percent 100), the same pass every epoch; its
    training the trace's recorded minibatches."""
    a, its = trace["args"], trace["iterations"]
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=[
            "protocol=official", "algo=fedala", "algo.lr=0.1", f"algo.eta={a['eta']}",
            f"algo.layer_idx={a['layer_idx']}",
            "algo.start_epochs=11", "algo.ala_steps=null", "model=dnn", "model.hidden=[8]", "model.activation=relu",
            f"rounds={a['rounds']}",
            f"tau={trace['phases'][0][1]}", f"batch_size={a['batch_size']}", f"clients_per_round={a['join']}",
            "frac=null",
            "device=cpu", f"engine={engine}", *extra])
    apply_protocol(cfg)
    assert not validate(cfg)
    data = golden_data()
    algorithm = instantiate(cfg.algo)
    model = instantiate(cfg.model, in_features=data.in_features, num_classes=data.num_classes)
    params = {base.NAMES[k]: torch.tensor(v) for k, v in trace["init"].items()}
    B = a["batch_size"]

    def sample_phases(data, sched, phases, seed, rnd, train_all=False):
        it, longest = its[rnd - 1], int((data.train.sizes // B).max())
        clients = torch.tensor(it["selected"])
        out = []
        for ph in phases:
            if ph.epochs is None:  # the training steps: the recorded minibatches
                idx = [[[r + int(data.train.offsets[c]) for r in b]]
                       for c in it["selected"] for b in it["batches"][str(c)]["train"]]
                out.append(fedrun.simulate.PhaseDraw(torch.tensor(idx).view(len(clients), ph.steps, 1, B), None))
                continue
            idx, live = [], []
            for c in it["selected"]:
                n, off = int(data.train.sizes[c]), int(data.train.offsets[c])
                rows = [list(range(off + s, off + s + B)) for s in range(0, n // B * B, B)]
                idx.append((rows + [rows[0]] * (longest - len(rows))) * ph.epochs)
                live.append(([True] * len(rows) + [False] * (longest - len(rows))) * ph.epochs)
            out.append(fedrun.simulate.PhaseDraw(torch.tensor(idx).unsqueeze(2), torch.tensor(live)))
        return clients, clients, tuple(out)

    states = []
    with mock.patch.object(fedrun.simulate, "sample_phases", sample_phases):
        fedrun.simulate.simulate(algorithm, ENGINES[cfg.engine](model), data, params, schedule(cfg, data.num_clients),
                                 cfg.seed, on_checkpoint=lambda at: states.append(at.state), checkpoint_every=1)
    for it, state in zip(its, states):  # PFLlib's ALA passes: 0 on the first round, its start phase, then 1
        ran = state.clients.ala["started"]
        assert ({int(c): p for c, p in it["ala_passes"].items()}
                == {c: (11 if it is its[1] else 1) * bool(ran[c]) for c in range(4)})
    return states


def compare(trace: dict, states: list) -> dict[str, float]:
    """field -> worst |d| - ATOL - RTOL |ref| over its entries in every round (> 0: a mismatch)."""
    worst: dict[str, float] = {}
    assert len(states) == len(trace["iterations"])
    for it, state in zip(trace["iterations"], states):
        for field, mine in FIELDS[trace["algorithm"]].items():
            rows = {None: it[field]} if field == "server" else it[field]
            for c, models in rows.items():
                if (trace["algorithm"], field) in SELECTED_ONLY and int(c) not in it["selected"]:
                    continue
                for name, ref in models.items():
                    key = base.NAMES[name]
                    val = state.params[key] if c is None else client_entries(state.clients)[mine][key][int(c)]
                    ref = np.asarray(ref, dtype=np.float64)
                    d = np.abs(ref - val.detach().double().numpy())
                    worst[field] = max(worst.get(field, -np.inf), float((d - ATOL - RTOL * np.abs(ref)).max()))
    return worst


@pytest.mark.parametrize("algo", list(OPTIONS))
def test_official_protocol_replays_pfllib_mixing(algo):
    trace = load(algo)
    worst = compare(trace, replay(trace))
    assert set(worst) == set(FIELDS[algo]) and all(v <= 0 for v in worst.values()), worst


def test_fedamp_loop_engine_and_the_paper_rule():
    """The loop engine replays FedAMP's trace too; follow=paper (its proximal gradient toward u_i,
    which PFLlib's detached regularizer lacks) moves the clients' models off it."""
    trace = load("fedamp")
    assert all(v <= 0 for v in compare(trace, replay(trace, engine="loop")).values())
    worst = compare(trace, replay(trace, ["algo.follow=paper"]))
    assert worst["clients"] > 0
