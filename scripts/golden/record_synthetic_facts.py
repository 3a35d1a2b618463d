#!/usr/bin/env python
"""Record facts of the official Synthetic(alpha, beta) data, by RUNNING the authors' generators.

Writes the fixture that tests/test_synthetic_official.py checks fedrun's `data=synthetic` against:
for every variant and client, the train/test sizes of the official cut, the label histogram and
`rows_digest` (sha256 of the client's sorted rows, train and test together, x as float32), since
the official shuffle (Python's unseeded `random.shuffle`) decides only which rows are test rows.

Variants (fedrun settings that must reproduce them, same seed):
    pfedme_0.5_0.5   pFedMe data/Synthetic/generate_synthetic_05_05.py (seeds np.random with 0 itself)
    fedprox_0_0, fedprox_0.5_0.5, fedprox_1_1, fedprox_iid
                     FedProx data/synthetic_*/generate_*.py (unseeded: run after np.random.seed(seed))

Each generator's own main() runs unmodified, in a temporary folder (it writes
data/train/mytrain.json and data/test/mytest.json relative to the working directory); its JSON is
then read back. Needs numpy and tqdm (the authors' imports).

    python scripts/golden/record_synthetic_facts.py --pfedme /work/ext/pfedme --fedprox /work/ext/fedprox
    python scripts/golden/record_synthetic_facts.py ... --compare     # also count clients fedrun matches
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from fedrun.data.datasets.synthetic import generate_synthetic, rows_digest  # noqa: E402

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "synthetic_official.json")
FEDPROX = dict(num_clients=30, size_factor=1)
# name -> (checkout, path in it, seed set before main() or None when the file seeds itself, fedrun settings)
VARIANTS = {
    "pfedme_0.5_0.5": ("pfedme", "data/Synthetic/generate_synthetic_05_05.py", None, dict(seed=0)),
    "fedprox_0_0": ("fedprox", "data/synthetic_0_0/generate_synthetic.py", 0, dict(alpha=0, beta=0, seed=0, **FEDPROX)),
    "fedprox_0.5_0.5": ("fedprox", "data/synthetic_0.5_0.5/generate_synthetic.py", 0,
                        dict(alpha=0.5, beta=0.5, seed=0, **FEDPROX)),
    "fedprox_1_1": ("fedprox", "data/synthetic_1_1/generate_synthetic.py", 0, dict(alpha=1, beta=1, seed=0, **FEDPROX)),
    "fedprox_iid": ("fedprox", "data/synthetic_iid/generate_iid.py", 0,
                    dict(alpha=0, beta=0, iid=True, seed=0, **FEDPROX)),
}


def run_official(path: str, seed: int | None) -> list[dict]:
    """Runs the generator's main() as written; returns per client {x float32, y int64, n_train}."""
    spec = importlib.util.spec_from_file_location(f"official_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "data", "train"))
        os.makedirs(os.path.join(tmp, "data", "test"))
        os.chdir(tmp)
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # it prints every mean vector
                spec.loader.exec_module(module)  # pFedMe's file calls np.random.seed(0) here
                if seed is not None:
                    np.random.seed(seed)
                module.main()
            with open("data/train/mytrain.json") as f:
                train = json.load(f)
            with open("data/test/mytest.json") as f:
                test = json.load(f)
        finally:
            os.chdir(cwd)
    clients = []
    for u in train["users"]:
        tr, te = train["user_data"][u], test["user_data"][u]
        x = np.asarray(tr["x"] + te["x"], dtype=np.float64).astype(np.float32)
        y = np.asarray(tr["y"] + te["y"], dtype=np.float64)
        assert np.array_equal(y, np.round(y)), "labels must be whole numbers"
        clients.append({"x": x, "y": y.astype(np.int64), "n_train": len(tr["y"])})
    return clients


def facts(x: np.ndarray, y: np.ndarray, n_train: int, num_classes: int) -> dict:
    return {"n_train": int(n_train), "n_test": int(len(y) - n_train),
            "labels": np.bincount(y, minlength=num_classes).tolist(), "digest": rows_digest(x, y)}


def fedrun_facts(settings: dict) -> list[dict]:
    train, test = generate_synthetic(**settings)
    return [facts(np.concatenate([xtr, xte]), np.concatenate([ytr, yte]), len(ytr), 10)
            for (xtr, ytr), (xte, yte) in zip(train, test)]


def _commit(checkout: str) -> str | None:
    try:
        return subprocess.run(["git", "-C", checkout, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except Exception:
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--pfedme", required=True, help="work tree of CharlieDinh/pFedMe")
    ap.add_argument("--fedprox", required=True, help="work tree of litian96/FedProx")
    ap.add_argument("--commits", default="", help="'pfedme=<sha>,fedprox=<sha>' to record (the exports carry no .git)")
    ap.add_argument("--out", default=FIXTURE)
    ap.add_argument("--compare", action="store_true", help="also print how many clients fedrun reproduces")
    args = ap.parse_args()
    checkouts = {"pfedme": args.pfedme, "fedprox": args.fedprox}
    commits = dict(kv.split("=", 1) for kv in args.commits.split(",") if kv)
    out = {"about": "Facts of the official synthetic data, recorded by scripts/golden/record_synthetic_facts.py "
                    "(per client, in order: official train/test sizes, label histogram and digest of its rows, "
                    "train + test together; digest = fedrun.data.datasets.synthetic.rows_digest).",
           "numpy": np.__version__, "sources": {k: commits.get(k) or _commit(v) for k, v in checkouts.items()},
           "variants": {}}
    for name, (repo, rel, seed, settings) in VARIANTS.items():
        clients = run_official(os.path.join(checkouts[repo], rel), seed)
        official = [facts(c["x"], c["y"], c["n_train"], 10) for c in clients]
        out["variants"][name] = {"generator": f"{repo}:{rel}", "np_random_seed": 0 if seed is None else seed,
                                 "fedrun": settings, **{k: [c[k] for c in official] for k in official[0]}}
        total = sum(c["n_train"] + c["n_test"] for c in official)
        print(f"{name}: {len(official)} clients, {total} rows", flush=True)
        if args.compare:
            mine = fedrun_facts(settings)
            same_rows = sum(a["digest"] == b["digest"] for a, b in zip(official, mine))
            same_cut = sum((a["n_train"], a["n_test"]) == (b["n_train"], b["n_test"]) for a, b in zip(official, mine))
            bad = [k for k, (a, b) in enumerate(zip(official, mine)) if a["digest"] != b["digest"]]
            print(f"  fedrun {settings}: rows identical for {same_rows}/{len(official)} clients, "
                  f"train/test sizes for {same_cut}/{len(official)}" + (f"; differ: {bad[:10]}" if bad else ""),
                  flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    text = json.dumps(out, indent=1)
    text = re.sub(r"\[[-0-9.,\s]*\]", lambda m: re.sub(r"\s+", " ", m.group(0)), text)  # number lists on one line
    with open(args.out, "w") as f:
        f.write(text + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
