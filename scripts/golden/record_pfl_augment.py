"""Golden trace of the authors' CIFAR training augmentation (alpemreacar/PFL: utils_dataset.Dataset
with train=True), for tests/test_golden_pfl.py.

    python scripts/golden/record_pfl_augment.py --authors /work/ext/pfl [--out tests/fixtures/golden]

The golden traces of record_pfl.py feed both codes un-augmented batches, so they do not cover the
augmentation. This records it: N random CIFAR-shaped uint8 images (RandomState(SEED), every pixel in
1..255, so that a 0 in an output can only be padding), held as their loader holds them (uint8 / 255,
float32), go through their Dataset(train=True) one by one after torch.manual_seed(SEED), with their
Normalize mean / std set to MEAN / STD: ToPILImage, RandomCrop(32, padding=4), RandomHorizontalFlip,
ToTensor, Normalize. Stored in tests/fixtures/golden/pfl_augment.json: each output turned back into
its uint8 pixels ((out * std + mean) * 255, rounded; the recorder checks that this is exact), as
base64, and the sum of each float output. The crop offsets and flips are their torch draws; the
test finds them by search and checks that fedrun's crop_flip_apply, given them, reproduces every
pixel, padding included.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import sys

import numpy as np
import torch

SEED, N = 0, 8
MEAN, STD = [0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616]


def images() -> np.ndarray:
    """The recorded inputs, uint8 [N, 3, 32, 32], every pixel in 1..255."""
    return np.random.RandomState(SEED).randint(1, 256, size=(N, 3, 32, 32)).astype(np.uint8)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--authors", required=True, help="work tree of alpemreacar/PFL (utils_dataset.py ...)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "golden"))
    a = ap.parse_args()
    sys.path.insert(0, os.path.abspath(a.authors))
    import utils_dataset

    utils_dataset.DatasetObject.mean, utils_dataset.DatasetObject.std = MEAN, STD
    x01 = images().astype(np.float32) / np.float32(255)
    ds = utils_dataset.Dataset(x01, np.zeros((N, 1)), train=True, dataset_name="CIFAR10")
    torch.manual_seed(SEED)
    outs = [ds[i][0] for i in range(N)]
    mean, std = torch.tensor(MEAN)[:, None, None], torch.tensor(STD)[:, None, None]
    pixels = []
    for o in outs:
        p = (o.double() * std.double() + mean.double()) * 255
        assert float((p - p.round()).abs().max()) < 1e-3 and p.min() > -0.5 and p.max() < 255.5
        pixels.append(p.round().to(torch.uint8).numpy())
    pixels = np.stack(pixels)
    trace = {"seed": SEED, "n": N, "mean": MEAN, "std": STD, "padding": 4, "torch": torch.__version__,
             "pixels_b64": base64.b64encode(pixels.tobytes()).decode(), "shape": list(pixels.shape),
             "output_sums": [float(o.double().sum()) for o in outs]}
    path = os.path.join(os.path.abspath(a.out), "pfl_augment.json")
    with open(path, "w") as f:
        json.dump(trace, f, indent=0)
    print(f"{N} images, {int((pixels == 0).any(axis=(1, 2, 3)).sum())} with padding -> {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
