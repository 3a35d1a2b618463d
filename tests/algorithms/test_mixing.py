"""The model-mixing methods of issue 36 (FedAMP, FedPHP, FedALA) beyond their PFLlib traces
(tests/test_golden_pfllib_mix.py): their server-side mixtures against a hand computation, their
per-client state through a checkpoint and resume, and their bad options in one line each."""
from __future__ import annotations

import math

import pytest
import torch
from test_baselines import test_per_client_state_survives_a_checkpoint_and_resume as resume_check

from fedrun.algorithms.base import ServerState
from fedrun.algorithms.fedala import FedALA
from fedrun.algorithms.fedamp import FedAMP, FedAMPClients
from fedrun.algorithms.fedphp import FedPHP, mmd_rbf
from fedrun.errors import ConfigError


def test_fedamp_cloud_models_and_fedphp_mmd_by_hand():
    """FedAMP: u_i = sum_{j sent, j != i} xi_ij w_j + (1 - sum xi_ij) w_i, xi_ij = alpha_k e^{-d/sigma}/sigma;
    FedPHP's MMD^2 is the mean over pairs of its kernel sum."""
    algo = FedAMP(lr=0.1, alpha_k=2.0, sigma=3.0)
    W = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0], [5.0, 5.0]], dtype=torch.float64)
    state = ServerState(params={"w": W[0]}, extra={"sent": torch.tensor([True, True, True, False])},
                        clients=FedAMPClients(params={"w": W}, u={"w": W}))
    ids = torch.tensor([0, 3])
    u = algo.cloud_models(state, {"w": W[ids]}, ids)["w"]
    for row, i in enumerate(ids.tolist()):
        xi = {j: 2.0 * math.exp(-float(((W[i] - W[j]) ** 2).sum()) / 3.0) / 3.0 for j in range(3) if j != i}
        want = sum(x * W[j] for j, x in xi.items()) + (1 - sum(xi.values())) * W[i]
        assert torch.allclose(u[row], want, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(u[0], W[0])  # the attention moved it

    a, b = torch.randn(5, 3, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64) + 1
    k = lambda p, q: sum(math.exp(-0.5 * float(((p - q) ** 2).sum()) / s) for s in (10, 15, 20, 50))
    want = sum(k(a[i], a[j]) + k(b[i], b[j]) - 2 * k(a[i], b[j]) for i in range(5) for j in range(5)) / 25
    assert mmd_rbf(a, b).item() == pytest.approx(want, rel=1e-10)


@pytest.mark.parametrize("algo", [FedAMP(lr=0.1, sigma=10.0), FedPHP(lr=0.1, mu=0.9, lam=0.5, mu_rounds=3),
                                  FedALA(lr=0.1, start_epochs=2, ala_steps=2)], ids=lambda a: a.name)
def test_mixing_state_survives_a_checkpoint_and_resume(tmp_path, algo):
    """(FedPHP with mu_rounds given: null would take each run's own rounds, 2 for the interrupted one.)"""
    resume_check(tmp_path, algo)


@pytest.mark.parametrize("cls, option, value, words", [
    (FedAMP, "sigma", 0, "algo.sigma=0 must be a number > 0"),
    (FedAMP, "follow", "both", "algo.follow='both' is not allowed; choose one of: paper, pfllib"),
    (FedPHP, "mu", 1.5, "algo.mu=1.5 must be a number in [0, 1]"),
    (FedPHP, "serve", "global", "algo.serve='global' is not allowed; choose one of: local, hpm"),
    (FedALA, "start_epochs", 0, "algo.start_epochs=0 must be an integer >= 1"),
    (FedALA, "layer_idx", -1, "algo.layer_idx=-1 must be an integer >= 0"),
])
def test_bad_mixing_options_get_one_line(cls, option, value, words):
    with pytest.raises(ConfigError) as e:
        cls(**{option: value})
    assert str(e.value) == words


def test_fedala_layer_idx_past_the_models_parameter_tensors_is_refused():
    """names[-layer_idx:] takes them all past the count: layer_idx=99 ran as layer_idx=0, silently."""
    params = {"fc1.weight": torch.zeros(3, 2), "fc1.bias": torch.zeros(3), "fc2.weight": torch.zeros(2, 3),
              "fc2.bias": torch.zeros(2)}
    FedALA(layer_idx=4).check_params(params)
    with pytest.raises(ConfigError) as e:
        FedALA(layer_idx=5).check_params(params)
    assert str(e.value) == ("algo.layer_idx=5 exceeds this model's 4 parameter tensors; allowed: 0..4 (the last "
                            "layer_idx tensors are mixed; 0: all)")
