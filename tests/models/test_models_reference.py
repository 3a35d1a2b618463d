"""Every model of fedrun.models against a reference with copied weights: forward (features and logits)
and the gradient of every parameter, in float64.

The references are written independently of fedrun's code: torchvision's BasicBlock and ResNet (with
the CIFAR stem), torch.nn.LSTM with the head on the last step (LEAF's Shakespeare model), torch.nn.
TransformerEncoder with `src_key_padding_mask`, a per-row loop for TextCNN and fastText, and the CNNs
and fully connected networks as their papers' code writes them (PFLlib's FedAvgCNN, the authors' CNN
of paper 004, FedBN's conv-BN-ReLU-pool, pFedMe's and Per-FedAvg's DNNs). BatchNorm models are compared
in training mode (batch statistics, and the running statistics they leave) and in evaluation mode
(random running statistics). The fully connected models' fast paths (stacked_forward,
stacked_ce_grad, class_major_logits) are compared with the same references, client by client.

Weights move entry by entry in registration order (`_copy`, shapes checked): a reference registers its
layers in the order of the paper's code, so a fedrun model whose layers are built in another order
gets the same weights and computes something else.

Tolerance (`_close`): float64, |mine - ref| <= 2**20 eps max|ref| (2.3e-10 relative). Each value here
is a chain of at most ~40 layers, each a sum of at most ~5000 products (3x3x512 at ResNet width 64)
whose rounding is <= fan-in x eps of the terms' magnitudes, and normalizations that divide by a
standard deviation of order one: 40 x 5000 x 5 < 2**20. The bugs these tests are for change values
by 1e-3 relative or more."""
from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedrun.models import (
    CNN,
    CNNBN,
    LSTM,
    MLP,
    MLPBN,
    MLR,
    FastText,
    FedAvgCNN,
    ResNet10,
    ResNet18,
    ResNet34,
    TextCNN,
    Transformer,
)

EPS = torch.finfo(torch.float64).eps
TOL = 2 ** 20 * EPS
VOCAB = 20


def _close(mine: torch.Tensor, ref: torch.Tensor, what: str = "", scale: float | None = None) -> None:
    """|mine - ref| <= TOL x scale; scale: the magnitude of the terms ref sums (default max|ref|)."""
    assert mine.shape == ref.shape, (what, mine.shape, ref.shape)
    assert torch.isfinite(ref).all(), what
    err = (mine - ref).abs().max().item()
    bound = TOL * max(ref.abs().max().item() if scale is None else scale, EPS)
    assert err <= bound, f"{what}: max |mine - ref| = {err:.3g} > {bound:.3g}"


def _perturb(model: nn.Module, seed: int) -> nn.Module:
    """model in float64 with every parameter moved off its initialization (BatchNorm's weight 1 and
    bias 0 too) and random running statistics, so that no weight is special."""
    g = torch.Generator().manual_seed(seed)
    model = model.double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g, dtype=p.dtype))
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(0.3 * torch.randn(b.shape, generator=g, dtype=b.dtype))
            elif name.endswith("running_var"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g, dtype=b.dtype))
    return model


def _copy(src: nn.Module, dst: nn.Module) -> nn.Module:
    """dst's parameters and buffers set to src's, entry by entry in registration order (shapes checked)."""
    s, d = src.state_dict(), dst.state_dict()
    assert len(s) == len(d), (list(s), list(d))
    with torch.no_grad():
        for (ks, vs), (kd, vd) in zip(s.items(), d.items()):
            assert vs.shape == vd.shape, (ks, vs.shape, kd, vd.shape)
            vd.copy_(vs)
    return dst


def _compare(mine: nn.Module, ref: nn.Module, x: torch.Tensor, train: bool = False) -> None:
    """Features, logits and every parameter's gradient of (logits x R).sum() (R fixed random) agree;
    in training mode also the running statistics the pass leaves."""
    mine.train(train)
    ref.train(train)
    h, z = mine(x, features="both")
    h_ref, z_ref = ref(x)
    _close(h, h_ref, "features")
    _close(z, z_ref, "logits")
    r = torch.randn(z.shape, generator=torch.Generator().manual_seed(1), dtype=z.dtype)
    mp, rp = list(mine.parameters()), list(ref.parameters())
    assert len(mp) == len(rp)
    grads, ref_grads = torch.autograd.grad((z * r).sum(), mp), torch.autograd.grad((z_ref * r).sum(), rp)
    # the scale of a gradient: the largest of any parameter's (a bias before BatchNorm has a gradient
    # of exactly 0, computed as a sum of terms of that order that cancel)
    scale = max(g.abs().max().item() for g in ref_grads)
    for (name, _), a, b in zip(mine.named_parameters(), grads, ref_grads):
        _close(a, b, f"grad {name}", scale)
    for (name, a), b in zip(mine.named_buffers(), ref.buffers()):
        _close(a.double(), b.double(), f"buffer {name}")


# ---- ResNets: torchvision's blocks with the CIFAR stem ----------------------------------------------

NORMS = {"bn": nn.BatchNorm2d, "gn": functools.partial(nn.GroupNorm, 2), "none": lambda c: nn.Identity()}


class TorchvisionResNet(nn.Module):
    """torchvision's ResNet of BasicBlocks at any first width: conv3x3-norm-ReLU stem (the CIFAR stem,
    no max-pool), torchvision's BasicBlock with a conv1x1-norm downsample where the shape changes,
    average pooling, fc."""

    def __init__(self, blocks, width: int, norm: str, in_channels: int, classes: int):
        super().__init__()
        # imported here, not at collection: torchvision.models imports torch._dynamo (~5 s per process)
        from torchvision.models import resnet as tv

        layer = NORMS[norm]
        self.conv1, self.bn1 = tv.conv3x3(in_channels, width), layer(width)
        stages, inplanes = [], width
        for i, n in enumerate(blocks):
            planes, stride, stage = width * 2 ** i, 1 if i == 0 else 2, []
            for j in range(n):
                down = None
                if j == 0 and (stride != 1 or inplanes != planes):
                    down = nn.Sequential(tv.conv1x1(inplanes, planes, stride), layer(planes))
                stage.append(tv.BasicBlock(inplanes, planes, stride if j == 0 else 1, down, norm_layer=layer))
                inplanes = planes
            stages.append(nn.Sequential(*stage))
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(inplanes, classes)

    def forward(self, x):
        h = torch.flatten(F.adaptive_avg_pool2d(self.stages(F.relu(self.bn1(self.conv1(x)))), 1), 1)
        return h, self.fc(h)


RESNETS = {"resnet10": (ResNet10, (1, 1, 1, 1)), "resnet18": (ResNet18, (2, 2, 2, 2)),
           "resnet34": (ResNet34, (3, 4, 6, 3))}


def _images(n: int, c: int, s: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, c, s, s, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


RESNET_CASES = [("resnet10", "bn", True), ("resnet10", "bn", False), ("resnet10", "gn", True),
                ("resnet10", "none", True),
                ("resnet18", "bn", True), ("resnet18", "gn", True), ("resnet34", "bn", True)]


@pytest.mark.parametrize("name,norm,train", RESNET_CASES)
def test_resnet_equals_torchvision_blocks(name, norm, train):
    """fedrun's ResNet-10/18/34 (width 4) = torchvision's BasicBlocks with the CIFAR stem; BatchNorm in
    training (batch statistics, running statistics after) and evaluation mode, GroupNorm with 2 groups,
    no norm (the blocks are the same in every ResNet: the deeper ones in one mode). 16x16 images leave
    2x2 maps after the last stage, so the pooling is seen (8x8 leave 1x1: any pooling is the identity)."""
    make, blocks = RESNETS[name]
    torch.manual_seed(0)
    mine = _perturb(make(3 * 256, 5, norm=norm, groups=2, width=4), seed=1)
    ref = _copy(mine, TorchvisionResNet(blocks, 4, norm, 3, 5).double())
    _compare(mine, ref, _images(3, 3, 16), train)


# ---- LSTM: nn.LSTM, the head on the last step -------------------------------------------------------

class LeafLSTM(nn.Module):
    """LEAF's Shakespeare model: embedding, nn.LSTM (batch_first), the head on the last step's output."""

    def __init__(self, embed: int, hidden: int, layers: int, classes: int):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, embed)
        self.lstm = nn.LSTM(embed, hidden, layers, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        out, _ = self.lstm(self.embedding(x))
        return out[:, -1, :], self.head(out[:, -1, :])


@pytest.mark.parametrize("layers", [1, 2])
def test_lstm_equals_nn_lstm_with_the_head_on_the_last_step(layers):
    torch.manual_seed(0)
    mine = _perturb(LSTM(6, 4, vocab_size=VOCAB, embed_dim=3, hidden=5, layers=layers), seed=3)
    ref = _copy(mine, LeafLSTM(3, 5, layers, 4).double())
    x = torch.randint(0, VOCAB, (3, 6), generator=torch.Generator().manual_seed(4))
    _compare(mine, ref, x)


# ---- Transformer: nn.TransformerEncoder with src_key_padding_mask -----------------------------------

class TorchTransformer(nn.Module):
    """Embedding x sqrt(dim) + the sinusoidal encodings (PE[pos, 2i] = sin, PE[pos, 2i+1] = cos,
    Vaswani et al. 2017 Sec. 3.5), nn.TransformerEncoder (post-norm, ReLU, no dropout) with the
    padding tokens (id 0) as src_key_padding_mask, mean over the real tokens or the first token."""

    def __init__(self, dim: int, heads: int, ff: int, layers: int, classes: int, pool: str):
        super().__init__()
        self.dim, self.pool = dim, pool
        self.embedding = nn.Embedding(VOCAB, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, ff, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        length = x.shape[1]
        pe = torch.zeros(length, self.dim, dtype=torch.float64)
        pos = torch.arange(length, dtype=torch.float64).unsqueeze(1)
        div = torch.exp(torch.arange(0, self.dim, 2, dtype=torch.float64) * (-math.log(10000.0) / self.dim))
        pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
        pad = x == 0
        h = self.encoder(self.embedding(x) * math.sqrt(self.dim) + pe, src_key_padding_mask=pad)
        if self.pool == "mean":
            real = (~pad).double().unsqueeze(-1)
            h = (h * real).sum(1) / real.sum(1)
        else:
            h = h[:, 0]
        return h, self.head(h)


def _tokens(n: int, length: int, seed: int, real=None) -> torch.Tensor:
    """n rows of token ids 1..VOCAB-1; row i has real[i] real tokens, then padding (0)."""
    x = torch.randint(1, VOCAB, (n, length), generator=torch.Generator().manual_seed(seed))
    if real is not None:
        x = torch.where(torch.arange(length) < torch.tensor(real).unsqueeze(1), x, 0)
    return x


def _transformer(pool: str) -> Transformer:
    torch.manual_seed(0)
    return _perturb(Transformer(6, 3, vocab_size=VOCAB, dim=8, heads=2, layers=2, ff=12, pool=pool), seed=5)


@pytest.mark.parametrize("pool", Transformer.POOLS)
def test_transformer_equals_nn_transformer_encoder_with_padding_mask(pool):
    mine = _transformer(pool)
    ref = _copy(mine, TorchTransformer(8, 2, 12, 2, 3, pool).double())
    # training mode for torch's slow path (its eval fast path zeroes padded outputs); no dropout either way
    _compare(mine, ref.train(), _tokens(3, 6, 6, real=[6, 4, 2]), train=True)


@pytest.mark.parametrize("pool", Transformer.POOLS)
def test_transformer_padding_changes_no_logits(pool):
    """Trailing padding tokens change neither features nor logits (nor the gradients)."""
    mine = _transformer(pool)
    x = _tokens(3, 5, 7, real=[5, 3, 1])
    longer = torch.cat([x, torch.zeros(3, 4, dtype=x.dtype)], 1)
    (h, z), (h2, z2) = mine(x, features="both"), mine(longer, features="both")
    _close(h2, h, "features")
    _close(z2, z, "logits")
    r = torch.randn(z.shape, generator=torch.Generator().manual_seed(1), dtype=z.dtype)
    p = list(mine.parameters())
    for a, b in zip(torch.autograd.grad((z2 * r).sum(), p), torch.autograd.grad((z * r).sum(), p)):
        _close(a, b, "grad")


# ---- TextCNN and fastText: a per-row loop -----------------------------------------------------------

class RowByRow(nn.Module):
    """A per-row implementation over its own copies of the weights (state in `p`, in fedrun's order)."""

    def __init__(self, mine: nn.Module, row):
        super().__init__()
        self.names = [n for n, _ in mine.named_parameters()]
        self.p = nn.ParameterList(nn.Parameter(v.detach().clone()) for v in mine.parameters())
        self.row = row

    def forward(self, x):
        p = dict(zip(self.names, self.p))
        h = torch.stack([self.row(p, [int(t) for t in r]) for r in x])
        return h, h @ p["head.weight"].T + p["head.bias"]


def _embedded(p, tokens):
    """[L, dim]: each token's embedding row, zeros for the padding token 0."""
    emb = p["embedding.weight"]
    return torch.stack([emb[t] if t != 0 else torch.zeros_like(emb[0]) for t in tokens])


def _textcnn_row(kernels, p, tokens):
    """Kim's TextCNN on one row: per width k, every window of k tokens (padding included, as PFLlib's
    max-pool over the padded length), ReLU, the max over windows; the widths' maxima concatenated."""
    e, out = _embedded(p, tokens), []
    for i, k in enumerate(kernels):
        w, b = p[f"convs.{i}.weight"], p[f"convs.{i}.bias"]  # [channels, dim, k]
        windows = [F.relu(torch.einsum("cdk,kd->c", w, e[s:s + k]) + b) for s in range(len(tokens) - k + 1)]
        out.append(torch.stack(windows).amax(0))
    return torch.cat(out)


def _fasttext_row(p, tokens):
    """fastText on one row: the mean embedding of its real tokens (zeros if none), the hidden layer."""
    real = [t for t in tokens if t != 0]
    m = _embedded(p, real).mean(0) if real else torch.zeros_like(p["embedding.weight"][0])
    return p["hidden.weight"] @ m + p["hidden.bias"]


def test_textcnn_equals_a_per_row_loop():
    torch.manual_seed(0)
    mine = _perturb(TextCNN(7, 3, vocab_size=VOCAB, dim=4, channels=3, kernels=(2, 3)), seed=8)
    ref = RowByRow(mine, functools.partial(_textcnn_row, (2, 3)))
    _compare(mine, ref, _tokens(3, 7, 9, real=[7, 4, 3]))


def test_fasttext_equals_a_per_row_loop():
    torch.manual_seed(0)
    mine = _perturb(FastText(6, 3, vocab_size=VOCAB, dim=5), seed=10)
    _compare(mine, RowByRow(mine, _fasttext_row), _tokens(4, 6, 11, real=[6, 3, 1, 0]))


# ---- the CNNs and fully connected networks as their papers' code writes them -----------------------

class PFLlibFedAvgCNN(nn.Module):
    """PFLlib's FedAvgCNN (system/flcore/trainmodel/models.py)."""

    def __init__(self, in_features=1, num_classes=10, dim=1024):
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv2d(in_features, 32, kernel_size=5, padding=0, stride=1, bias=True),
                                   nn.ReLU(inplace=True), nn.MaxPool2d(kernel_size=(2, 2)))
        self.conv2 = nn.Sequential(nn.Conv2d(32, 64, kernel_size=5, padding=0, stride=1, bias=True),
                                   nn.ReLU(inplace=True), nn.MaxPool2d(kernel_size=(2, 2)))
        self.fc1 = nn.Sequential(nn.Linear(dim, 512), nn.ReLU(inplace=True))
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        out = torch.flatten(self.conv2(self.conv1(x)), 1)
        out = self.fc1(out)
        return out, self.fc(out)


class AuthorsCNN(nn.Module):
    """Paper 004's CIFAR model (alpemreacar/PFL's client_model 'cifar10'); `bn`: FedBN's order,
    conv-BN-ReLU-pool."""

    def __init__(self, n_cls: int, side: int, bn: bool = False):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 5)
        self.bn1 = nn.BatchNorm2d(64) if bn else nn.Identity()
        self.conv2 = nn.Conv2d(64, 64, 5)
        self.bn2 = nn.BatchNorm2d(64) if bn else nn.Identity()
        self.pool = nn.MaxPool2d(2, 2)
        self.fc1, self.fc2, self.fc3 = nn.Linear(64 * side * side, 384), nn.Linear(384, 192), nn.Linear(192, n_cls)

    def forward(self, x):
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = self.pool(F.relu(self.bn2(self.conv2(x))))
        x = x.view(x.shape[0], -1)
        x = F.relu(self.fc2(F.relu(self.fc1(x))))
        return x, self.fc3(x)


ACT = {"relu": F.relu, "elu": F.elu, "tanh": torch.tanh, "sigmoid": torch.sigmoid}


class DNN(nn.Module):
    """pFedMe's DNN (fc1-ReLU-fc2) and Per-FedAvg's (80-60, ELU): Linear [-> BatchNorm1d] -> activation
    per hidden layer, then the output Linear, on the flattened input."""

    def __init__(self, sizes, act: str, bn: bool = False):
        super().__init__()
        self.fcs = nn.ModuleList()
        for a, b in zip(sizes[:-1], sizes[1:]):
            self.fcs.append(nn.Linear(a, b))
            if bn and b != sizes[-1]:
                self.fcs.append(nn.BatchNorm1d(b))
        self.act = ACT[act]

    def forward(self, x):
        x, layers, i = x.flatten(1), list(self.fcs), 0
        while i < len(layers) - 1:
            x, i = layers[i](x), i + 1
            if isinstance(layers[i], nn.BatchNorm1d):
                x, i = layers[i](x), i + 1
            x = self.act(x)
        return x, layers[-1](x)


@pytest.mark.parametrize("in_channels", [1, 3])
def test_fedavg_cnn_equals_pfllibs(in_channels):
    torch.manual_seed(0)
    mine = _perturb(FedAvgCNN(in_channels * 400, 4, in_channels=in_channels, image_size=20), seed=12)
    ref = _copy(mine, PFLlibFedAvgCNN(in_channels, 4, dim=64 * 2 * 2).double())
    _compare(mine, ref, _images(2, in_channels, 20))


@pytest.mark.parametrize("layout", ["channels_last", "contiguous"])
def test_cnn_equals_the_authors(layout):
    torch.manual_seed(0)
    mine = _perturb(CNN(3 * 400, 4, in_channels=3, image_size=20), seed=13)
    mine.layout = layout
    _compare(mine, _copy(mine, AuthorsCNN(4, 2).double()), _images(2, 3, 20))


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_cnn_bn_equals_fedbns_order(train):
    torch.manual_seed(0)
    mine = _perturb(CNNBN(3 * 400, 4, in_channels=3, image_size=20), seed=14)
    _compare(mine, _copy(mine, AuthorsCNN(4, 2, bn=True).double()), _images(3, 3, 20), train)


@pytest.mark.parametrize("hidden,act", [((5,), "relu"), ((6, 5), "elu"), ((4,), "tanh"), ((4,), "sigmoid")])
def test_mlp_equals_the_papers_dnn(hidden, act):
    torch.manual_seed(0)
    mine = _perturb(MLP(12, 3, hidden=hidden, activation=act), seed=15)
    _compare(mine, _copy(mine, DNN((12, *hidden, 3), act).double()), _images(4, 3, 2))


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_mlp_bn_equals_linear_bn_activation(train):
    torch.manual_seed(0)
    mine = _perturb(MLPBN(12, 3, hidden=(6, 5), activation="relu"), seed=16)
    _compare(mine, _copy(mine, DNN((12, 6, 5, 3), "relu", bn=True).double()), _images(4, 3, 2), train)


def test_mlr_equals_one_linear_layer():
    torch.manual_seed(0)
    mine = _perturb(MLR(12, 3), seed=17)
    _compare(mine, _copy(mine, DNN((12, 3), "relu").double()), _images(4, 3, 2))


# ---- the fast paths of the fully connected models and the CNN, client by client ---------------------

def _clients(make, ref_make, m: int):
    """m references with different weights, and their weights stacked under fedrun's names."""
    mine, refs = make(), []
    for i in range(m):
        torch.manual_seed(i)
        refs.append(_copy(_perturb(make(), seed=20 + i), ref_make()))
    names = [n for n, _ in mine.named_parameters()]
    params = {n: torch.stack([list(r.parameters())[j].detach() for r in refs]) for j, n in enumerate(names)}
    return mine, refs, params


FAST = {
    "mlr": (lambda: MLR(12, 3).double(), lambda: DNN((12, 3), "relu").double()),
    "mlp_relu": (lambda: MLP(12, 3, hidden=(5,)).double(), lambda: DNN((12, 5, 3), "relu").double()),
    "mlp_elu": (lambda: MLP(12, 3, hidden=(6, 5), activation="elu").double(),
                lambda: DNN((12, 6, 5, 3), "elu").double()),
    "mlp_tanh": (lambda: MLP(12, 3, hidden=(4,), activation="tanh").double(), lambda: DNN((12, 4, 3), "tanh").double()),
    "mlp_sigmoid": (lambda: MLP(12, 3, hidden=(4,), activation="sigmoid").double(),
                    lambda: DNN((12, 4, 3), "sigmoid").double()),
}


@pytest.mark.parametrize("name", FAST)
def test_fully_connected_fast_paths_equal_the_reference_per_client(name):
    """stacked_forward (per-client logits), stacked_ce_grad (mean, weighted, and shared params) and
    class_major_logits equal the reference's logits and autograd's cross-entropy gradients."""
    mine, refs, params = _clients(*FAST[name], m=2)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 4, 12, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (2, 4), generator=g)
    wt = torch.rand(2, 4, generator=g, dtype=torch.float64)
    _close(mine.stacked_forward(params, x), torch.stack([r(x[i])[1] for i, r in enumerate(refs)]), "stacked_forward")
    _close(mine.class_major_logits({k: v[0] for k, v in params.items()}, x[1]), refs[0](x[1])[1].T,
           "class_major_logits")
    for weight in (None, wt):
        grads, losses = mine.stacked_ce_grad(params, x, y, weight)
        for i, r in enumerate(refs):
            z = r(x[i])[1]
            loss = (F.cross_entropy(z, y[i]) if weight is None
                    else (F.cross_entropy(z, y[i], reduction="none") * weight[i]).sum())
            _close(losses[i], loss.detach(), "loss")
            for n, gr in zip(params, torch.autograd.grad(loss, list(r.parameters()))):
                _close(grads[n][i], gr, f"grad {n}")
    shared = {k: v[0] for k, v in params.items()}
    grads, _ = mine.stacked_ce_grad(shared, x, y, None, shared=True)
    for i in range(2):
        loss = F.cross_entropy(refs[0](x[i])[1], y[i])
        for n, gr in zip(params, torch.autograd.grad(loss, list(refs[0].parameters()))):
            _close(grads[n][i], gr, f"shared grad {n}")


@pytest.mark.parametrize("per_client", [True, False], ids=["per_client", "vmap"])
def test_cnn_stacked_forward_equals_the_authors_per_client(per_client):
    make = lambda: CNN(3 * 400, 4, in_channels=3, image_size=20).double()  # noqa: E731
    mine, refs, params = _clients(make, lambda: AuthorsCNN(4, 2).double(), m=2)
    x = torch.randn(2, 3, 3 * 400, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    want = torch.stack([r(x[i].reshape(3, 3, 20, 20))[1] for i, r in enumerate(refs)])
    _close(mine.stacked_forward(params, x, per_client=per_client), want, "stacked_forward")
