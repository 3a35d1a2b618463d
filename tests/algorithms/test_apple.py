"""APPLE (issue 36) beyond its PFLlib trace (tests/test_golden_pfllib_apple.py): its mixtures and
normalized p-gradients by hand, for one set of cores shared by all clients (an expanded view) and for
a set per client (batched seeds); held-out clients' columns of p stay 0; its per-client state through
a checkpoint and resume; its bad options in one line each."""
from __future__ import annotations

import pytest
import torch
from test_baselines import test_per_client_state_survives_a_checkpoint_and_resume as resume_check

from fedrun.algorithms.apple import APPLE, _dots, mix, mix_local
from fedrun.algorithms.base import RunInfo
from fedrun.errors import ConfigError


def test_mixtures_and_p_gradients_by_hand():
    g = torch.Generator().manual_seed(0)
    cores = {"w": torch.randn(3, 2, 4, generator=g, dtype=torch.float64),
             "b": torch.randn(3, 2, generator=g, dtype=torch.float64)}
    p = torch.rand(2, 3, generator=g, dtype=torch.float64)
    grads = {k: torch.randn(2, *v.shape[1:], generator=g, dtype=torch.float64) for k, v in cores.items()}
    shared = {k: v.unsqueeze(0).expand(2, *v.shape) for k, v in cores.items()}
    own = {k: v.unsqueeze(0).repeat(2, *[1] * v.dim()) for k, v in cores.items()}
    for view in (shared, own):
        got, dots = mix_local(p, view), _dots(grads, view)
        for i in range(2):
            for k in cores:
                assert torch.allclose(got[k][i], sum(p[i, j] * cores[k][j] for j in range(3)), atol=1e-12)
                assert torch.allclose(mix(p, cores)[k][i], got[k][i], atol=1e-12)
            for j in range(3):
                want = sum((grads[k][i] * cores[k][j]).mean() for k in cores) / 2
                assert dots[i, j].item() == pytest.approx(want.item(), rel=1e-12)


def test_held_out_columns_stay_zero_and_state_survives_a_resume(tmp_path):
    algo = APPLE(lr=0.1, dr_lr=1.0, mu=0.5, decay=1.0, decay_rounds=3)
    state = algo.init({"w": torch.zeros(2)}, 4)
    assert state.clients.p["p"][0].tolist() == [0.25] * 4
    algo = algo.bind(RunInfo(train_sizes=torch.tensor([1, 3])))  # 2 training clients of 4
    state = algo.init({"w": torch.zeros(2)}, 4)
    assert state.clients.p["p"][0].tolist() == [0.5, 0.5, 0, 0] and state.extra["p0"].tolist() == [0.25, 0.75, 0, 0]
    local = algo.client_init(state, torch.tensor([0, 1]), 1)
    local = local._replace(params={"w": torch.ones(2, 2)}, cores={"w": torch.randn(2, 4, 2)})

    class Engine:  # (the local trainer's `grad` calls state_grad: gradients, losses, BatchNorm buffers)
        def state_grad(self, w, x, y, wrt=None):
            return {"w": torch.ones_like(w["w"])}, None, {}
    out = algo.client_step(Engine(), local, [(None, None)], 1)
    assert (out.p[:, 2:] == 0).all() and (out.p[:, :2] != local.p[:, :2]).all()
    resume_check(tmp_path, APPLE(lr=0.1, dr_lr=1.0, mu=0.5, decay=1.0, decay_rounds=3))


@pytest.mark.parametrize("option, value, words", [
    ("dr_lr", -1, "algo.dr_lr=-1 must be a number >= 0"),
    ("decay_rounds", -1, "algo.decay_rounds=-1 must be an integer >= 0 or null"),
    ("follow", "both", "algo.follow='both' is not allowed; choose one of: paper, pfllib"),
])
def test_bad_apple_options_get_one_line(option, value, words):
    with pytest.raises(ConfigError) as e:
        APPLE(**{option: value})
    assert str(e.value) == words
