#!/usr/bin/env python
"""Record what the authors' pFedMe MNIST generator makes, by RUNNING it, for tests/test_mnist_pfedme_authors.py.

The generator is CharlieDinh/pFedMe data/Mnist/generate_niid_20users.py as it stood when the paper
was written (commit 1819c29, May 2020; the file changed in June 2021 and makes other data since):

    git -C <pFedMe clone> show 1819c29:data/Mnist/generate_niid_20users.py > gen_2020.py
    python scripts/golden/record_mnist_pfedme_authors.py --generator gen_2020.py --data-root ../shared/data

It runs the file's own code in a temporary folder, with two stand-ins, none to its logic:
- sklearn's `fetch_openml('mnist_784')` returns the MNIST files under the root as sklearn 0.22 did:
  float64 pixels and string labels, the 60,000 training images then the 10,000 test images in file
  order (OpenML's order for mnist_784);
- numpy 1.18 took a np.bool_ slice bound (their `idx[l]`) as 0 or 1 with a DeprecationWarning;
  numpy 2 refuses it, so that one bound is wrapped in int().
Their JSON (data/train/mnist_train.json, data/test/mnist_test.json) is then read back.

Fixture (tests/fixtures/mnist_pfedme_authors.json):
- "tiny": the generator on the 800-image MNIST the tests write (tests/helpers.write_mnist_idx with
  the labels of `tiny_labels` below): per client, the image ids of its train and test rows in
  their order (decoded from the two id pixels), the labels the generator wrote, and the float64
  sums of its rows' features and of their squares;
- "full": the generator on the MNIST under --data-root (the published files): the digit counts
  and the first ten labels (all the split depends on besides positions), per client the train
  and test sizes and label histograms, the number of distinct images used, the pooled test rows
  that are also a training row of some client, and the rows whose label is not their image's.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import sys
import tempfile
import types

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from fedrun.data.datasets.idx import load_mnist  # noqa: E402
from tests.helpers import write_mnist_idx  # noqa: E402

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "mnist_pfedme_authors.json")


def tiny_labels() -> tuple[np.ndarray, np.ndarray]:
    """600 training and 200 test labels, 80 per digit; the 5th training label is a 9 (as in MNIST)."""
    rng = np.random.RandomState(3)
    train = rng.permutation(np.repeat(np.arange(10), 60)).astype(np.uint8)
    train[[4, int(np.flatnonzero(train == 9)[0])]] = train[[int(np.flatnonzero(train == 9)[0]), 4]]
    return train, rng.permutation(np.repeat(np.arange(10), 20)).astype(np.uint8)


def run_generator(generator: str, root: str) -> tuple[dict, dict]:
    """Runs their generator on the MNIST under `root`; returns their (train, test) JSON dicts."""
    trx, try_, tex, tey = load_mnist(root, download=False)
    x = np.concatenate([trx, tex]).reshape(-1, 784).astype(np.float64)
    y = np.concatenate([try_, tey]).astype(str).astype(object)

    def fetch_openml(name, data_home=None, **kw):
        assert name == "mnist_784"
        return types.SimpleNamespace(data=x.copy(), target=y)

    datasets = types.ModuleType("sklearn.datasets")
    datasets.fetch_openml = fetch_openml
    sys.modules["sklearn"] = types.ModuleType("sklearn")
    sys.modules["sklearn.datasets"] = datasets
    src = open(generator).read()
    old = "mnist_data[l][idx[l]:num_samples]"
    if src.count(old) != 1:
        raise SystemExit(f"{generator}: not the May 2020 generator (no `{old}`)")
    src = src.replace(old, "mnist_data[l][int(idx[l]):num_samples]")
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                exec(compile(src, generator, "exec"), {"__name__": "__main__"})
            return tuple(json.load(open(f"data/{s}/mnist_{s}.json")) for s in ("train", "test"))
        finally:
            os.chdir(here)


def _rows(blob: dict, user: str) -> tuple[np.ndarray, np.ndarray]:
    d = blob["user_data"][user]
    return np.asarray(d["x"], np.float32).reshape(-1, 784), np.asarray(d["y"]).astype(np.int64)


def tiny_facts(generator: str) -> dict:
    train_labels, test_labels = tiny_labels()
    with tempfile.TemporaryDirectory() as root:
        images = np.concatenate(write_mnist_idx(root, train_labels, test_labels)).reshape(-1, 784).astype(np.float64)
        tr, te = run_generator(generator, root)
    mu, sigma = images.mean(0), images.std(0) + 0.001
    clients = []
    for u in tr["users"]:
        c = {}
        for name, blob in (("train", tr), ("test", te)):
            x, lab = _rows(blob, u)
            px = np.rint(x[:, :2].astype(np.float64) * sigma[:2] + mu[:2]).astype(np.int64)  # the id pixels
            c[name] = {"ids": (px[:, 0] + 256 * px[:, 1]).tolist(), "labels": lab.tolist(),
                       "x_sum": float(x.astype(np.float64).sum()), "x_sq_sum": float((x.astype(np.float64) ** 2).sum())}
        clients.append(c)
    return {"train_labels": train_labels.tolist(), "test_labels": test_labels.tolist(), "clients": clients}


def full_facts(generator: str, root: str) -> dict:
    trx, try_, tex, tey = load_mnist(root, download=False)
    labels = np.concatenate([try_, tey]).astype(np.int64)
    images = np.concatenate([trx, tex]).reshape(len(labels), -1)
    true_label = {hashlib.sha1(im.tobytes()).hexdigest(): int(lab) for im, lab in zip(images, labels)}
    tr, te = run_generator(generator, root)
    mu = images.astype(np.float32).mean(0)
    sigma = images.astype(np.float32).std(0) + np.float32(0.001)

    def keys(x):  # their rows back to raw pixels (exact after rounding), hashed like `true_label`
        raw = np.rint(x.astype(np.float64) * sigma + mu).astype(np.uint8)
        return [hashlib.sha1(r.tobytes()).hexdigest() for r in raw]

    facts = {"digit_counts": np.bincount(labels, minlength=10).tolist(), "first_labels": labels[:10].tolist(),
             "clients": []}
    train_keys, test_keys, wrong = set(), [], 0
    for u in tr["users"]:
        c = {}
        for name, blob in (("train", tr), ("test", te)):
            x, lab = _rows(blob, u)
            k = keys(x)
            wrong += sum(true_label[h] != int(v) for h, v in zip(k, lab))
            (train_keys.update if name == "train" else test_keys.extend)(k)
            c[name] = {"size": len(lab), "label_counts": np.bincount(lab, minlength=10).tolist()}
        facts["clients"].append(c)
    facts["distinct_images"] = len(train_keys | set(test_keys))
    facts["test_rows"] = len(test_keys)
    facts["test_rows_in_some_train"] = sum(k in train_keys for k in test_keys)
    facts["mislabelled_rows"] = wrong
    return facts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--generator", required=True, help="their generate_niid_20users.py at commit 1819c29")
    ap.add_argument("--data-root", required=True, help="folder holding the published MNIST in MNIST/raw")
    o = ap.parse_args()
    facts = {"generator": "CharlieDinh/pFedMe 1819c29 data/Mnist/generate_niid_20users.py",
             "tiny": tiny_facts(o.generator), "full": full_facts(o.generator, o.data_root)}
    with open(FIXTURE, "w") as f:
        json.dump(facts, f, separators=(",", ":"))
        f.write("\n")
    full = facts["full"]
    sizes = [c["train"]["size"] for c in full["clients"]]
    print(f"wrote {FIXTURE}: full MNIST: training sizes {min(sizes)}..{max(sizes)}, "
          f"{full['distinct_images']} distinct images, {full['test_rows_in_some_train']} of {full['test_rows']} "
          f"test rows also training rows, {full['mislabelled_rows']} mislabelled rows")


if __name__ == "__main__":
    main()
