"""Records tests/fixtures/draws.json: what fedrun's own random streams draw, pinned.

  - for (seed, round) in PAIRS and each `sampling`: the round's clients and every minibatch's row
    indices as `fedrun.simulate.sample_round` draws them (tests/test_sampling.py's toy split);
  - the synthetic data's train/test cut per client: the sha256 of each client's test rows (x as
    float32 bytes, then y as int64 bytes), for synthetic(num_clients=5, seed=0) and seed=3.

These are fedrun's own choices (no reference code draws them), so the fixture is recorded from
fedrun and guards against drift: re-record ONLY for a deliberate change of a stream, and say so.
    python scripts/golden/record_draws.py
"""
from __future__ import annotations

import hashlib
import json
import os
import sys

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(REPO, "tests", "fixtures", "draws.json")
PAIRS = [(0, 1), (0, 2), (7, 1), (7, 5)]
SIZES = [3, 5, 7, 12, 4, 9]
SCHED = dict(rounds=5, tau=2, clients_per_round=3, batch_size=4)
SYNTHETIC = [dict(num_clients=5, seed=0), dict(num_clients=5, seed=3)]


def toy_data():
    from fedrun.data.federated import ClientSplit, FederatedData

    n = sum(SIZES)
    s = ClientSplit.from_flat(torch.arange(n, dtype=torch.float32).view(n, 1), torch.zeros(n, dtype=torch.long),
                              torch.tensor(SIZES), chunk_len=4)
    return FederatedData(name="toy", train=s, test=s, num_classes=2)


def draws() -> dict:
    from fedrun.simulate import SAMPLING, Schedule, sample_round

    data, out = toy_data(), {}
    for sampling in SAMPLING:
        sched = Schedule(**SCHED, sampling=sampling)
        for seed, rnd in PAIRS:
            for k, train_all in ((1, False), (2, True)):
                clients, trained, idx = sample_round(data, sched, k, seed, rnd, train_all)
                out[f"{sampling}/seed={seed}/round={rnd}/k={k}/train_all={train_all}"] = {
                    "clients": clients.tolist(), "trained": trained.tolist(), "rows": idx.tolist()}
    return out


def cuts() -> dict:
    from fedrun.data import synthetic

    out = {}
    for opts in SYNTHETIC:
        d = synthetic(**opts, cache_dir=None)
        per_client = []
        for c in range(d.num_clients):
            rows = d.test.client_rows(c)
            h = hashlib.sha256(d.test.x[rows].to(torch.float32).numpy().tobytes())
            h.update(d.test.y[rows].to(torch.int64).numpy().tobytes())
            per_client.append(h.hexdigest())
        out[f"num_clients={opts['num_clients']}/seed={opts['seed']}"] = per_client
    return out


if __name__ == "__main__":
    sys.path.insert(0, REPO)
    fixture = {"draws": draws(), "synthetic_test_rows_sha256": cuts()}
    with open(OUT, "w") as f:  # one entry a line
        f.write("{\n" + ",\n".join(
            f" {json.dumps(part)}: {{\n" + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in entries.items())
            + "\n }" for part, entries in fixture.items()) + "\n}\n")
    print(f"wrote {OUT}")
