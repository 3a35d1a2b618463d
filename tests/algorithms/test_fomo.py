"""FedFomo (issue 36) beyond its PFLlib trace (tests/test_golden_pfllib_fomo.py): its neighbour
weights and mixture against a hand computation, its per-client state (models, old models, the
affinity matrix) through a checkpoint and resume, and its bad options in one line each."""
from __future__ import annotations

import math

import pytest
import torch
from test_baselines import test_per_client_state_survives_a_checkpoint_and_resume as resume_check

from fedrun.algorithms.fedfomo import FedFomo, weigh
from fedrun.errors import ConfigError


class SquaredError:
    """A stand-in engine: the loss of model w on rows (x, y) is mean((x . w - y)^2)."""

    def grad(self, p, x, y):
        return None, ((x * p["w"].unsqueeze(1)).sum(-1) - y).square().mean(1)


def test_fedfomo_weights_and_mixture_by_hand():
    """w_n = (L(base) - L(theta_n)) / (||theta_n - base|| + 1e-5) over the mean of the minibatches'
    losses; the model becomes sum max(w_n, 0) theta_n / sum max(w_n, 0), or stays when no w_n > 0;
    a neighbour not live gets w_n = 0."""
    g = torch.Generator().manual_seed(0)
    base = {"w": torch.randn(2, 3, generator=g, dtype=torch.float64)}
    own = {"w": torch.randn(2, 3, generator=g, dtype=torch.float64)}
    target = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    nbrs = {"w": torch.stack([torch.stack([target, -5 * target, target + 0.1]), torch.stack([-9 * target] * 3)])}
    live = torch.tensor([[True, True, False], [True, True, True]])
    batches = []
    for _ in range(2):
        x = torch.randn(2, 4, 3, generator=g, dtype=torch.float64)
        batches.append((x, (x * target).sum(-1)))
    mixed, w = weigh(SquaredError(), base, own, nbrs, live, batches)
    L = lambda c, v: sum(float((((x[c] * v).sum(-1) - y[c]) ** 2).mean()) for x, y in batches) / 2
    for c in range(2):
        want = [(L(c, base["w"][c]) - L(c, nbrs["w"][c, n])) / (float((nbrs["w"][c, n] - base["w"][c]).norm()) + 1e-5)
                if live[c, n] else 0.0 for n in range(3)]
        assert w[c].tolist() == pytest.approx(want, rel=1e-12)
    assert w[0, 0] > 0 > w[0, 1] and w[0, 2] == 0  # a good neighbour, a bad one, one not live
    assert torch.allclose(mixed["w"][0], nbrs["w"][0, 0])  # the only positive weight
    assert (w[1] <= 0).all() and torch.equal(mixed["w"][1], own["w"][1])  # nothing helps: kept
    assert not math.isclose(float(w[0, 0]), 0.0)


def test_fedfomo_state_survives_a_checkpoint_and_resume(tmp_path):
    resume_check(tmp_path, FedFomo(lr=0.1, M=2, val_batches=1))


@pytest.mark.parametrize("option, value, words", [
    ("M", 0, "algo.M=0 must be an integer >= 1"),
    ("val_batches", 1.5, "algo.val_batches=1.5 must be an integer >= 1"),
    ("follow", "both", "algo.follow='both' is not allowed; choose one of: paper, pfllib"),
])
def test_bad_fedfomo_options_get_one_line(option, value, words):
    with pytest.raises(ConfigError) as e:
        FedFomo(**{option: value})
    assert str(e.value) == words
