"""The models of fedrun.models beyond the 2020-21 papers' (fedavg_cnn, resnet10/18/34, lstm, fasttext,
textcnn, transformer): the vmap and loop engines agree on a few FedAvg rounds of each (every device
branch forced in turn, as fedrun.bench.agreement does for the small models), the LSTM's recurrence equals
nn.LSTM, the Transformer's layer equals nn.TransformerEncoderLayer, every model of conf/model names
the head that the body/head algorithms split off, and bad options get one line.

Sizes are tiny (width-4 ResNets on 8x8 images, a 5-unit LSTM, 8-wide text models) and float64, so the
engines are held to fedrun.bench.agreement's float64 tolerances."""
from __future__ import annotations

import functools

import pytest
import torch
from helpers import group_options
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch.func import functional_call

from fedrun.algorithms import build
from fedrun.algorithms.base import flat_clients
from fedrun.bench import agreement
from fedrun.branches import settings
from fedrun.config import group_file, load_conf
from fedrun.data import ClientSplit, FederatedData
from fedrun.engine import LoopEngine, VmapEngine, params_of
from fedrun.engine.batchnorm import split_buffers
from fedrun.engine.tree import head_names
from fedrun.errors import ConfigError
from fedrun.models import LSTM, FastText, FedAvgCNN, ResNet10, ResNet18, TextCNN, Transformer
from fedrun.models.rnn import lstm_layers
from fedrun.simulate import Schedule, simulate

VOCAB, LENGTH = 20, 7  # token ids 0..19 (0: padding), rows of 7 tokens
TEXT = dict(vocab_size=VOCAB)

# name -> (model from (in_features, num_classes), input kind, algorithms run on it)
MODELS = {
    "fedavg_cnn": (lambda f, k: FedAvgCNN(f, k, in_channels=1, image_size=16), (1, 16, 16), ("fedavg",)),
    "resnet10_bn": (lambda f, k: ResNet10(f, k, norm="bn", width=4), (3, 8, 8), ("fedavg", "fedbn")),
    "resnet10_gn": (lambda f, k: ResNet10(f, k, norm="gn", width=4), (3, 8, 8), ("fedavg", "fedrep")),
    "resnet18_none": (lambda f, k: ResNet18(f, k, norm="none", width=4), (3, 8, 8), ("fedavg",)),
    "lstm": (lambda f, k: LSTM(f, k, vocab_size=VOCAB, embed_dim=3, hidden=5), "chars", ("fedavg", "fedper")),
    "fasttext": (lambda f, k: FastText(f, k, dim=6, **TEXT), "tokens", ("fedavg",)),
    "textcnn": (lambda f, k: TextCNN(f, k, dim=6, channels=3, kernels=(2, 3), **TEXT), "tokens", ("fedavg",)),
    "transformer": (lambda f, k: Transformer(f, k, dim=8, heads=2, ff=16, **TEXT), "tokens", ("fedavg", "lgfedavg")),
}


def _rows(kind, n: int, g: torch.Generator) -> torch.Tensor:
    """n input rows: Gaussian images of shape `kind`, character ids (no padding), or token ids whose
    rows end in 0-4 padding tokens (and one row of padding alone)."""
    if isinstance(kind, tuple):
        return torch.randn(n, *kind, generator=g, dtype=torch.float64)
    x = torch.randint(1, VOCAB, (n, LENGTH), generator=g)
    if kind == "tokens":
        keep = LENGTH - torch.randint(0, 5, (n, 1), generator=g)
        x = torch.where(torch.arange(LENGTH) < keep, x, 0)
        x[0] = 0
    return x


@functools.lru_cache(maxsize=None)
def _data(kind) -> FederatedData:
    """fedrun.bench.agreement's client sizes and chunks (full passes in groups that cut clients in two);
    labels from each row's first value plus its client's shift, so clients differ."""
    g = torch.Generator().manual_seed(1)

    def split(sizes) -> ClientSplit:
        x = _rows(kind, sum(sizes), g)
        owner = torch.arange(len(sizes)).repeat_interleave(torch.tensor(sizes))
        y = ((x.flatten(1)[:, 0] * 10).long() + owner) % agreement.CLASSES
        return ClientSplit.from_flat(x, y, torch.tensor(sizes), agreement.CHUNK)

    return FederatedData(f"models_{kind}", split(agreement.TRAIN), split(agreement.TEST), agreement.CLASSES)


@functools.lru_cache(maxsize=None)
def _loop_run(name: str, algo: str):
    """The loop engine's run, the reference of every path setting, computed once."""
    return _run(name, algo, None)


def _run(name: str, algo: str, paths: dict | None):
    """Final state and logged rows of fedrun.bench.agreement's schedule: the vmap engine with `paths`
    forced, or the loop engine (paths None)."""
    make, kind, _ = MODELS[name]
    data = _data(kind)
    torch.manual_seed(0)
    model = make(data.in_features, data.num_classes).double()
    if paths is None:
        engine = LoopEngine(model)
    else:
        engine = VmapEngine(model, max_chunks=agreement.MAX_CHUNKS, paths=paths)
        engine.CPU_GROUP_ROWS = agreement.GROUP_ROWS
    options = agreement.declared_options(algo)
    if algo == "fedavg" and name.endswith("_bn"):
        options["alpha"] = None  # FedAvg refuses test-time steps on a BatchNorm model
    rows = []
    state, _ = simulate(build(algo, **options), engine, data, params_of(model), Schedule(**agreement.SCHEDULE), 0,
                        on_eval=lambda r, t, ev: rows.append(ev.row))
    return state, rows


CASES = [(name, algo, paths) for name, (make, kind, algos) in MODELS.items() for algo in algos
         for paths in settings(make(16, 3))]


@pytest.mark.parametrize("name,algo,paths", CASES, ids=[f"{n}-{a}-{p or 'defaults'}" for n, a, p in CASES])
def test_vmap_and_loop_engines_agree(name, algo, paths):
    (sv, rows_v), (sl, rows_l) = _run(name, algo, paths), _loop_run(name, algo)
    rtol, atol = agreement.TOL[torch.float64]
    server = [(sv.params, sl.params), (sv.extra.get("buffers", {}), sl.extra.get("buffers", {}))]
    cv, cl = flat_clients(sv), flat_clients(sl)
    assert cv.keys() == cl.keys()
    for a, b in server + [(cv[s], cl[s]) for s in cl]:
        assert a.keys() == b.keys()
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=rtol, atol=atol, msg=k)
    rel, abs_ = agreement.METRIC_TOL[torch.float64]
    assert len(rows_v) == len(rows_l) == agreement.SCHEDULE["rounds"]
    for rv, rl in zip(rows_v, rows_l):
        assert rv.keys() == rl.keys()
        for k in rv:
            assert rv[k] == pytest.approx(rl[k], rel=rel, abs=abs_), k


def test_a_run_moves_the_parameters():
    """The agreement above compares runs that train: the parameters move from the initial ones."""
    make, kind, _ = MODELS["transformer"]
    torch.manual_seed(0)
    start = params_of(make(LENGTH, agreement.CLASSES).double())
    state, _ = _run("transformer", "fedavg", {})
    assert all(not torch.equal(state.params[k], start[k]) for k in start)


def test_lstm_recurrence_equals_nn_lstm():
    """lstm_layers computes what nn.LSTM does with the same weights (outputs at every step), and the
    gradients through it are nn.LSTM's."""
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(3, 5, 2, batch_first=True).double()
    x = torch.randn(4, 6, 3, dtype=torch.float64, requires_grad=True)
    mine, ref = lstm_layers(lstm, x), lstm(x)[0]
    torch.testing.assert_close(mine, ref, rtol=1e-12, atol=1e-12)
    gm = torch.autograd.grad(mine.square().sum(), [x, *lstm.parameters()])
    gr = torch.autograd.grad(ref.square().sum(), [x, *lstm.parameters()])
    for a, b in zip(gm, gr):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("rnn", ["fused", "batched"])
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_lstm_hand_backward_equals_autograd_per_client(rnn, shared, weighted):
    """The LSTM's gradients on the vmap engine's hand path (branch "backward"), both ways of branch
    "rnn" (torch's fused LSTM client by client; the batched recurrence with its backward through time
    by hand): every client's loss and gradients equal autograd's through lstm_layers, per-client or
    shared weights, mean or weighted (full passes' row masks) losses. float64, ~300 ops per value: 1e-12."""
    torch.manual_seed(0)
    model = LSTM(7, VOCAB, vocab_size=VOCAB, embed_dim=3, hidden=5).double()
    model.rnn = rnn
    m, b, t = 3, 4, 7
    stacked = {k: v.detach() + 0.1 * torch.randn(m, *v.shape, dtype=v.dtype) for k, v in model.named_parameters()}
    params = {k: v[0] for k, v in stacked.items()} if shared else stacked
    x, y = torch.randint(0, VOCAB, (m, b, t)), torch.randint(0, VOCAB, (m, b))
    weight = torch.rand(m, b, dtype=torch.float64) if weighted else None
    grads, losses = model.stacked_ce_grad(params, x, y, weight, shared)
    for i in range(m):
        p = {k: (v if shared else v[i]).clone().requires_grad_(True) for k, v in params.items()}
        rows = torch.nn.functional.cross_entropy(functional_call(model, p, (x[i],)), y[i], reduction="none")
        loss = rows.mean() if weight is None else (rows * weight[i]).sum()
        ref = torch.autograd.grad(loss, list(p.values()))
        torch.testing.assert_close(losses[i], loss.detach(), rtol=1e-12, atol=1e-12)
        for k, g in zip(p, ref):
            torch.testing.assert_close(grads[k][i], g, rtol=1e-12, atol=1e-12, msg=k)


def test_transformer_layer_equals_torch_encoder_layer():
    """EncoderLayer with nn.TransformerEncoderLayer's weights (post-norm, ReLU, no dropout) gives its
    outputs, with and without a key padding mask."""
    from fedrun.models.text import EncoderLayer

    torch.manual_seed(0)
    ref = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True).double().eval()
    mine = EncoderLayer(8, 2, 16).double()
    mine.load_state_dict({k.replace("self_attn.in_proj_", "in_proj.").replace("self_attn.", ""): v
                          for k, v in ref.state_dict().items()})
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] + [True] * 4])
    for mask in (torch.zeros_like(pad), pad):
        out = ref(x, src_key_padding_mask=mask)
        keep = ~mask  # (torch's fast path may zero the outputs at padded positions; they are never used)
        torch.testing.assert_close(mine(x, mask)[keep], out[keep], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", group_options("model"))
def test_every_model_names_its_head_where_the_split_algorithms_cut(name):
    """Every model of conf/model has `head`, its output layer: the parameters head_names gives FedPer,
    FedRep, LG-FedAvg and FedBABU are exactly the head's, and the head maps the model's features to
    its logits. Models are built at their configs' options for an input that fits them."""
    cfg = load_conf(group_file("model", name))
    small = {"in_channels": 1, "image_size": 16} if "in_channels" in cfg else {}
    if "width" in cfg:
        small["width"] = 4
    if "vocab_size" in cfg:
        small["vocab_size"] = 30
    model = instantiate(OmegaConf.merge(cfg, small), in_features=256, num_classes=3).double().eval()
    prefix = next(n for n, m in model.named_modules() if m is model.head)
    mine = [f"{prefix}.{k}" for k, _ in model.head.named_parameters()]
    assert head_names(split_buffers(params_of(model))[0]) == mine  # (as the algorithms call it)
    assert head_names(params_of(model)) == mine  # a model state (BatchNorm buffers listed last), as FedDBE calls it
    x = (torch.randint(1, 30, (2, LENGTH)) if "vocab_size" in cfg else torch.randn(2, 256, dtype=torch.float64))
    with torch.no_grad():
        feats, logits = model(x, features="both")
        torch.testing.assert_close(model.head(feats), logits)
        torch.testing.assert_close(model(x, features=True), feats)
        assert logits.shape == (2, 3)


@pytest.mark.parametrize("make, expected", [
    (lambda: ResNet18(3072, 10, norm="ln"), "model.norm='ln' is not allowed; choose one of: bn, gn, none"),
    (lambda: ResNet18(3072, 10, norm="gn", groups=3), "model.groups=3 must be an integer >= 1 that divides"),
    (lambda: Transformer(10, 4, dim=10, heads=4), "model.dim=10 must be a multiple of model.heads=4"),
    (lambda: Transformer(10, 4, pool="max"), "model.pool='max' is not allowed; choose one of: mean, first"),
])
def test_bad_model_options_get_one_line(make, expected):
    with pytest.raises(ConfigError) as e:
        make()
    assert str(e.value).startswith(expected) and "\n" not in str(e.value)


@pytest.mark.parametrize("in_features, shape", [(784, (1, 28)), (3072, (3, 32)), (3 * 64 * 64, (3, 64)),
                                                (60, (3, 32))])
def test_image_models_read_their_input_shape_from_the_data(in_features, shape):
    """in_channels/image_size null: MNIST, CIFAR, Tiny-ImageNet rows; rows that are no square image
    (the synthetic 60 features) build the CIFAR shape, which then does not fit them."""
    for model in (FedAvgCNN(in_features, 10), ResNet10(in_features, 10, width=4)):
        assert (model.in_channels, model.image_size) == shape
    assert FedAvgCNN(784, 10).hidden[0].in_features == 1024 and FedAvgCNN(3072, 10).hidden[0].in_features == 1600
