"""fedrun `algo=fedcp protocol=official` against the golden trace of PFLlib's FedCP.

scripts/golden/record_pfllib_fedcp.py ran PFLlib's clientCP and servercp.FedCP's methods on the tiny
problem of the other PFLlib traces with every pass a recorded shuffle and every Gumbel draw of the
gate recorded. The replay feeds fedrun the same initial weights, CPN, conditions, passes (replacing
`fedrun.simulate.sample_phases`) and noise (replacing `FedCP.gumbel`) and checks after every round
the server's body, global head and CPN and every client's head, global head, CPN and condition,
|fedrun - PFLlib| <= ATOL + RTOL |PFLlib| (float32). Also: the state through batched seeds and a
checkpoint, the noise's law, and a held-out client's onboarding.
"""
from __future__ import annotations

import numpy as np
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

CPN = {"fc.0.weight": "fc.weight", "fc.0.bias": "fc.bias", "fc.1.weight": "ln.weight", "fc.1.bias": "ln.bias"}


def replay(trace: dict, extra: list[str] = (), engine: str = "vmap") -> list:
    a = trace["args"]
    cfg = official_cfg("fedcp", ["algo.lr=0.1", f"algo.lam={a['lamda']}", f"algo.local_epochs={a['local_epochs']}"],
                       a, 1, engine, extra)
    data, algorithm, model, params = replay_setup(trace, cfg)
    its = trace["iterations"]
    C = data.num_clients
    # per round: every client's recorded noise [C, S, B, 2, d] (zero where it took no such step)
    S = max(len(n) for it in its for n in it["noise"].values())
    tables = []
    for it in its:
        t = torch.zeros(C, S, *np.shape(next(iter(it["noise"].values()))[0]))
        for c, n in it["noise"].items():
            t[int(c), :len(n)] = torch.tensor(n)
        tables.append(t)

    def sample_phases(data, sched, phases, seed, rnd, train_all=False):
        it, longest = its[rnd - 1], int((data.train.sizes // sched.batch_size).max())
        (ph,) = phases
        parts = [padded_passes(it["batches"][str(c)]["train"], ph.epochs, longest, int(data.train.offsets[c]))
                 for c in it["selected"]]
        draw = fedrun.simulate.PhaseDraw(torch.tensor([p[0] for p in parts]).view(len(parts), -1, 1, sched.batch_size),
                                         torch.tensor([p[1] for p in parts]))
        clients = torch.tensor(it["selected"])
        return clients, clients, (draw,)

    m = trace["modules"]
    init_modules = algorithm.init_modules

    def modules(p, num_clients):
        mods = init_modules(p, num_clients)
        return {**mods, "cpn": {CPN[k]: torch.tensor(v) for k, v in m["cs"].items()},
                "ctx": torch.tensor(m["contexts"])}

    algorithm.init_modules = modules
    algorithm.gumbel = lambda local, rnd, shape: tables[rnd - 1][local.cid, local.step.clamp(max=S - 1)]
    return replay_rounds(cfg, algorithm, ENGINES[cfg.engine](model), data, params, sample_phases=sample_phases)


def compare(trace: dict, states: list) -> Worst:
    """name -> worst |d| - ATOL - RTOL |ref| over every compared entry (> 0: a mismatch)."""
    worst = Worst()
    close = worst.close
    for it, state in worst.rounds(trace, states):
        for name, v in it["head_g"].items():
            close("head_g", v, state.extra["head_g"][name])
        for name, v in it["cs"].items():
            close("cpn", v, state.extra["cpn"][CPN[name]])
        part = state.clients.part
        for c, model in it["clients"].items():
            for name, v in model.items():
                if NAMES[name] in part:
                    close("head", v, part[NAMES[name]][int(c)])
            close("ctx", it["contexts"][c], state.clients.cond["ctx"][int(c)])
            if state.clients.head_g:
                for name, v in it["client_head_g"][c].items():
                    close("client_head_g", v, state.clients.head_g[name][int(c)])
                for name, v in it["client_cs"][c].items():
                    close("client_cpn", v, state.clients.cpn[CPN[name]][int(c)])
    return worst


def test_fedcp_replays_pfllib_and_the_paper_rule_does_not():
    """FedCP (follow=pfllib under protocol=official): the body, global head and CPN, every client's
    head, its copies of the global head and CPN and its condition after every round (vmap engine;
    test_engines_agree holds the loop engine to it). follow=paper (every client starts from the current global
    head and CPN, not from those of the last round it took part in) moves the body and the heads:
    client 3 sits out round 2 (rounds: [2, 3], [0, 2], [2, 3]), so PFLlib's round 3 starts it from
    round 1's global head and CPN."""
    trace = load("fedcp")
    worst = compare(trace, replay(trace))
    assert set(worst) == {"server", "head_g", "cpn", "head", "ctx", "client_head_g", "client_cpn"}, worst
    assert all(v <= 0 for v in worst.values()), worst
    paper = compare(trace, replay(trace, ["algo.follow=paper"]))
    assert paper["head"] > 0 and paper["server"] > 0


def test_fedcp_noise_batched_seeds_checkpoint_and_onboarding(tmp_path):
    """The gate's own noise is standard Gumbel (mean 0.5772, variance pi^2/6 over 2^18 draws), a
    function of (key, step) only; two seeds trained as one computation give each seed's own run, and
    2 rounds, a checkpoint written and read back, then 1 more give the 3 rounds straight, bit for bit
    (body, heads, global head, CPN, conditions, per-client copies); a held-out client gets the global
    head and CPN and a fitted head that lowers its served loss."""
    from fedrun.algorithms import build
    from fedrun.algorithms.fedcp import gumbel_noise
    from fedrun.engine import VmapEngine, params_of
    from fedrun.models import MLP
    from fedrun.simulate import Schedule, eval_context

    g = gumbel_noise(torch.tensor([5, 5, 6]), torch.tensor([0, 0, 0]), (2 ** 18,), torch.float64)
    assert torch.equal(g[0], g[1]) and not torch.equal(g[0], g[2])
    assert abs(g[0].mean() - 0.5772) < 0.01 and abs(g[0].var() - torch.pi ** 2 / 6) < 0.03

    data = golden_data()
    sched = Schedule(rounds=3, tau=3, clients_per_round=2, batch_size=4, eval_every=3)
    torch.manual_seed(0)
    model = MLP(12, 4, hidden=[8])
    params, algo = params_of(model), build("fedcp", lr=0.1, follow="pfllib")
    ref = batched_and_resumed(algo, model, data, params, sched, tmp_path)

    state, engine, new = ref[0], VmapEngine(model), torch.tensor([3])
    ctx = eval_context(data, sched, 0, 4)
    before = algo.score(engine, algo.personalize(engine, state, ctx)[0], data.train)[0][3]
    after_state = algo.onboard(engine, state, ctx, new)
    after = algo.score(engine, algo.personalize(engine, after_state, ctx)[0], data.train)[0][3]
    for k, v in state.extra["cpn"].items():
        assert torch.equal(after_state.clients.cpn[k][3], v)
    assert torch.equal(after_state.clients.cond["ctx"], state.clients.cond["ctx"]) and after < before
