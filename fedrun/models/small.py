"""The small models of the 2020-21 papers: MLR, MLP (DNN), paper 004's CNN, and their BatchNorm variants
(see fedrun.models for what every model offers the engine)."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ..branches import choose

ACTIVATIONS = {"relu": nn.ReLU, "elu": nn.ELU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}


def _outputs(h: torch.Tensor, head: nn.Module, features: bool | str):
    """forward's result from the last hidden layer h: the logits, h (features=True), or both."""
    if features == "both":
        return h, head(h)
    return h if features else head(h)


class MLR(nn.Module):
    """Multinomial logistic regression (softmax regression): one linear layer."""

    def __init__(self, in_features: int, num_classes: int):
        super().__init__()
        self.num_classes = num_classes
        self.linear = nn.Linear(in_features, num_classes)

    features_and_logits = True

    @property
    def head(self) -> nn.Module:
        """The output layer (every model has one `head`; see fedrun.models)."""
        return self.linear

    def forward(self, x: torch.Tensor, features: bool | str = False):
        x = x.flatten(1)
        return _outputs(x, self.linear, features)

    def stacked_forward(self, params: dict, x: torch.Tensor) -> torch.Tensor:
        return _stacked_linear(params, "linear", x.flatten(2))

    def class_major_logits(self, params: dict, x: torch.Tensor) -> torch.Tensor:
        return _class_major_logits(params, x, ["linear"])

    def stacked_ce_grad(self, params: dict, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None = None,
                        shared: bool = False, wrt: list | None = None) -> tuple[dict, torch.Tensor]:
        return _stacked_ce_grad(params, x, y, ["linear"], weight, shared, wrt)


def _stacked_linear(params: dict, name: str, x: torch.Tensor) -> torch.Tensor:
    """x [m, B, in] through per-client linear layers `name` (weight [m, out, in], bias [m, out]).
    A narrow layer (out <= 16, e.g. the 10 logits) is computed transposed, (W x^T)^T: MKL's batched
    product with an output of so few columns took ~2x longer (CPU, 100 clients, 20x20 -> 10)."""
    w, b = params[f"{name}.weight"], params[f"{name}.bias"]
    if w.shape[1] <= 16 and w.shape[1] < w.shape[2]:
        return torch.baddbmm(b.unsqueeze(2), w, x.transpose(1, 2)).transpose(1, 2)
    return torch.baddbmm(b.unsqueeze(1), x, w.transpose(1, 2))


def _act_grad(act: nn.Module, out: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """grad through activation `act` from its output `out` (the derivative each one has in terms of
    its output: ReLU 1[out > 0], ELU(alpha=1) out + 1 below 0, tanh 1 - out^2, sigmoid out (1 - out))."""
    if isinstance(act, nn.ReLU):  # the kernel autograd uses: one pass (grad * (out > 0) took ~7x longer)
        return torch.ops.aten.threshold_backward(grad, out, 0.0)
    if isinstance(act, nn.ELU) and act.alpha == 1.0:
        return torch.where(out > 0, grad, grad * (out + 1))
    if isinstance(act, nn.Tanh):
        return grad * (1 - out * out)
    if isinstance(act, nn.Sigmoid):
        return grad * (out * (1 - out))
    raise NotImplementedError(f"no hand-written derivative for {act}")


def _stacked_ce_grad(params: dict, x: torch.Tensor, y: torch.Tensor, layers: list, weight: torch.Tensor | None = None,
                     shared: bool = False, wrt: list | None = None) -> tuple[dict, torch.Tensor]:
    """Per-client gradients of the cross-entropy of a stack of linear layers (names) and activations
    (modules) on x [m, B, in], y [m, B], and the per-client losses [m]: the mean over the B rows, or
    with `weight` [m, B] the weighted sum. `shared`: params are unstacked, one model for all m
    (the gradients are still per client, [m, ...]). `wrt` (None: all): the parameters whose gradients
    are returned; the backward stops at the lowest layer holding one of them (a head step's gradient:
    no backward through the frozen body), the others' numbers those of the full pass.

    The logits and everything after them are class-major, [m, classes, B]: the softmax's reductions
    over a few classes then run along a middle dimension over contiguous rows of B values (CPU, 100
    clients x 20 rows x 10 classes: log_softmax 66 us instead of 117 us over the last dimension)."""
    h = x.flatten(2)
    saved = []  # the input of every linear layer, the output of every activation
    for layer in layers[:-1]:
        saved.append(h)
        if isinstance(layer, str):
            h = (torch.nn.functional.linear(h, params[f"{layer}.weight"], params[f"{layer}.bias"]) if shared
                 else _stacked_linear(params, layer, h))
        else:
            h = layer(h)
    saved.append(h)
    w, b = params[f"{layers[-1]}.weight"], params[f"{layers[-1]}.bias"]
    z = (torch.matmul(w, h.transpose(1, 2)).add_(b.unsqueeze(1)) if shared
         else torch.baddbmm(b.unsqueeze(2), w, h.transpose(1, 2)))  # [m, classes, B]
    logp = torch.log_softmax(z, 1)
    target = y.unsqueeze(1)
    nll = -logp.gather(1, target).squeeze(1)
    dz = logp.exp_().scatter_add_(1, target, torch.full(target.shape, -1.0, dtype=logp.dtype, device=z.device))
    # (logp's dtype: under bf16 autocast on CUDA, log_softmax gives float32 logits of bfloat16 z)
    if weight is None:  # d(mean loss)/d logits = (softmax - onehot) / B
        losses = nll.mean(1)
        dz = dz.mul_(1.0 / y.shape[1])
    else:
        losses = (nll * weight).sum(1)
        dz = dz.mul_(weight.unsqueeze(1))
    last = len(layers) - 1
    want = None if wrt is None else set(wrt)
    stop = 0 if want is None else min((i for i, layer in enumerate(layers) if isinstance(layer, str)
                                       and {f"{layer}.weight", f"{layer}.bias"} & want), default=last)
    grads = {f"{layers[last]}.weight": torch.bmm(dz, saved[last]), f"{layers[last]}.bias": dz.sum(2)}
    if stop < last:  # back to row-major [m, B, width] below the logits
        dz = dz.transpose(1, 2) @ w if shared else torch.bmm(dz.transpose(1, 2), w)
    for i in range(last - 1, stop - 1, -1):
        layer, a = layers[i], saved[i]
        if isinstance(layer, str):
            grads[f"{layer}.weight"] = torch.bmm(dz.transpose(1, 2), a)
            grads[f"{layer}.bias"] = dz.sum(1)
            if i > stop:
                dz = dz @ params[f"{layer}.weight"] if shared else torch.bmm(dz, params[f"{layer}.weight"])
        else:
            dz = _act_grad(layer, saved[i + 1], dz)
    return {k: grads[k] for k in params if want is None or k in want}, losses


def _class_major_logits(params: dict, x: torch.Tensor, layers: list) -> torch.Tensor:
    """One model's (unstacked params) logits for rows x [n, ...] as [classes, n], every layer
    feature-major, h^T <- W h^T + b. On the CPU (one thread, 16k rows of the synthetic data) the
    product with 10 output columns took ~4x longer row-major than transposed, the 60 -> 20 layer
    ~1.3x, and a softmax over 10 classes ~2x longer along the last dimension than along the first."""
    h = x.flatten(1).t()
    for layer in layers:
        h = (torch.addmm(params[f"{layer}.bias"].unsqueeze(1), params[f"{layer}.weight"], h)
             if isinstance(layer, str) else layer(h))
    return h


def _fully_connected(in_features: int, num_classes: int, hidden: Sequence[int], activation: str,
                     batchnorm: bool = False) -> nn.Sequential:
    """Linear [-> BatchNorm1d] -> activation per hidden width, then the output Linear."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"model.activation={activation!r} is not one of {sorted(ACTIVATIONS)}")
    layers: list[nn.Module] = []
    width = in_features
    for h in map(int, hidden):
        layers += [nn.Linear(width, h), *([nn.BatchNorm1d(h)] if batchnorm else []), ACTIVATIONS[activation]()]
        width = h
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


class MLP(nn.Module):
    """Fully connected network: in -> hidden[0] -> ... -> num_classes, `activation` between layers.

    Per-FedAvg's MNIST network is hidden=[80, 60] with ELU; pFedMe's DNNs are hidden=[20] (synthetic)
    and hidden=[100] (MNIST) with ReLU.
    """

    def __init__(self, in_features: int, num_classes: int, hidden: Sequence[int] = (20,), activation: str = "relu"):
        super().__init__()
        self.num_classes = num_classes
        self.net = _fully_connected(in_features, num_classes, hidden, activation)

    features_and_logits = True

    @property
    def head(self) -> nn.Module:
        """The output layer (every model has one `head`; see fedrun.models)."""
        return self.net[-1]

    def forward(self, x: torch.Tensor, features: bool | str = False):
        x = x.flatten(1)
        for layer in self.net[:-1]:
            x = layer(x)
        return _outputs(x, self.net[-1], features)

    def stacked_forward(self, params: dict, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(2)
        for i, layer in enumerate(self.net):
            x = _stacked_linear(params, f"net.{i}", x) if isinstance(layer, nn.Linear) else layer(x)
        return x

    def stacked_ce_grad(self, params: dict, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None = None,
                        shared: bool = False, wrt: list | None = None) -> tuple[dict, torch.Tensor]:
        return _stacked_ce_grad(params, x, y, self._layers(), weight, shared, wrt)

    def class_major_logits(self, params: dict, x: torch.Tensor) -> torch.Tensor:
        return _class_major_logits(params, x, self._layers())

    def _layers(self) -> list:
        """The layers as the hand-written passes take them: parameter names of linear layers, modules else."""
        return [f"net.{i}" if isinstance(layer, nn.Linear) else layer for i, layer in enumerate(self.net)]


class CNN(nn.Module):
    """Paper 004's CIFAR network (paper 004 Appendix A.1, alpemreacar/PFL), no padding (32 -> 28 -> 14 -> 10 -> 5):
    conv5x5(64)-ReLU-maxpool2, conv5x5(64)-ReLU-maxpool2, fc 1600-384-ReLU, fc 384-192-ReLU (the
    Proto features), fc 192-num_classes.

    `in_features` is accepted for the common model interface; inputs are [B, C, 32, 32] or flat
    [B, C * 32 * 32] (reshaped). `channels` and `hidden` (the paper's 64 and (384, 192)) narrow the
    same layers, for checks that need its passes, not its size (fedrun.bench.agreement).
    """

    def __init__(self, in_features: int, num_classes: int, in_channels: int = 3, image_size: int = 32,
                 channels: int = 64, hidden: Sequence[int] = (384, 192)):
        super().__init__()
        self.in_channels, self.image_size, self.num_classes = in_channels, image_size, num_classes
        side = ((image_size - 4) // 2 - 4) // 2
        self.conv = nn.Sequential(
            nn.Conv2d(in_channels, channels, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(channels, channels, 5), nn.ReLU(), nn.MaxPool2d(2),
        )
        widths = [channels * side * side, *hidden]
        self.hidden = nn.Sequential(*(m for a, b in zip(widths, widths[1:]) for m in (nn.Linear(a, b), nn.ReLU())))
        self.head = nn.Linear(widths[-1], num_classes)

    def _images(self, x: torch.Tensor, *batch: int) -> torch.Tensor:
        """Inputs as images [*batch, C, H, W]; on the CPU in channels-last memory order, which oneDNN's
        convolutions and max-pooling keep: 1.4x (batch 50, forward and backward) to 1.6x (batch 500,
        forward) faster there than NCHW, whose max-pooling alone costs more than the first convolution."""
        x = x.reshape(*batch, self.in_channels, self.image_size, self.image_size)
        forced = None if self.layout is None else {"layout": self.layout}
        if (choose("layout", x.device, forced) != "channels_last"
                or torch._C._functorch.maybe_current_level() is not None):
            return x  # (inside torch.func transforms, vmap cannot choose a memory order)
        return x.contiguous(memory_format=torch.channels_last)

    layout: str | None = None  # branch "layout" forced (fedrun.branches; None: the device's default)

    features_and_logits = True

    def forward(self, x: torch.Tensor, features: bool | str = False):
        x = self._images(x, x.shape[0])
        return _outputs(self.hidden(self.conv(x).flatten(1)), self.head, features)

    def stacked_forward(self, params: dict, x: torch.Tensor, per_client: bool | None = None) -> torch.Tensor:
        """Logits [m, B, classes] for per-client params: the convolutions client by client on the
        CPU (vmap would fold the clients into one grouped convolution over all m * B images, whose
        activations, 64x28x28 per image, leave the caches: 1.5x slower than the loop engine there),
        vmapped on other devices (one launch); the linear layers as batched matrix products.
        `per_client` forces the choice (branch "conv" of fedrun.branches; None: the device's)."""
        m, b = x.shape[:2]
        x = x.reshape(m, b, self.in_channels, self.image_size, self.image_size)
        conv = {k.removeprefix("conv."): v for k, v in params.items() if k.startswith("conv.")}
        if per_client is None:
            per_client = choose("conv", x.device) == "per_client"
        if per_client:
            h = torch.stack([torch.func.functional_call(self.conv, {k: v[i] for k, v in conv.items()},
                                                        (self._images(x[i], b),)).flatten(1) for i in range(m)])
        else:
            h = torch.func.vmap(lambda p, xi: torch.func.functional_call(self.conv, p, (xi,)))(conv, x)
        h = h.flatten(2)
        for i, layer in enumerate(self.hidden):
            h = _stacked_linear(params, f"hidden.{i}", h) if isinstance(layer, nn.Linear) else layer(h)
        return _stacked_linear(params, "head", h)


class MLPBN(nn.Module):
    """A fully connected network with BatchNorm: in -> [Linear -> BatchNorm1d -> activation] per
    hidden width -> Linear -> num_classes (FedBN's setting on cheap data; `model=mlp_bn`).

    In training mode BatchNorm normalizes by the minibatch's statistics and updates its running
    ones; fedrun's engines keep the model in eval mode otherwise (`Engine.train_grad`). No batched-
    matmul forward or hand-written backward: the engine goes through torch.func."""

    def __init__(self, in_features: int, num_classes: int, hidden: Sequence[int] = (20,), activation: str = "relu"):
        super().__init__()
        self.num_classes = num_classes
        self.net = _fully_connected(in_features, num_classes, hidden, activation, batchnorm=True)

    features_and_logits = True
    head = MLP.head
    forward = MLP.forward  # the same pass over `net` (not a subclass: MLP's stacked and hand-written passes have no BN)


class CNNBN(CNN):
    """Paper 004's CIFAR CNN with BatchNorm2d after each convolution (conv-BN-ReLU-pool, the order of
    FedBN's networks; `model=cnn_bn`). Its passes go through torch.func (no batched-matmul forward)."""

    def __init__(self, in_features: int, num_classes: int, in_channels: int = 3, image_size: int = 32):
        super().__init__(in_features, num_classes, in_channels, image_size)
        self.conv = nn.Sequential(
            nn.Conv2d(in_channels, 64, 5), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 5), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        )

    stacked_forward = None


def image_shape(in_features: int, in_channels: int | None, image_size: int | None) -> tuple[int, int]:
    """(channels, side) of square images of `in_features` values; an option left None is read from
    in_features (C x S x S with C = 3 when in_features / 3 is a square, else 1). Rows that are no
    square image (e.g. the synthetic vectors) give 3 x 32 x 32 (CIFAR), so a model can be built
    for them and `check_model_fits` names the models that do fit."""
    if in_channels is None:
        in_channels = next((c for c in (3, 1) if in_features % c == 0 and _square(in_features // c)), 3)
    if image_size is None:
        image_size = _square(in_features // in_channels) or 32
    return int(in_channels), int(image_size)


def _square(n: int) -> int:
    """The side of a square of n values, 0 if n is no square."""
    side = round(n ** 0.5)
    return side if side * side == n else 0


class FedAvgCNN(nn.Module):
    """PFLlib's FedAvgCNN (TsingZ0/PFLlib system/flcore/trainmodel/models.py; the CNN of McMahan et al.
    2017 that most PFLlib-based papers call "CNN"): conv5x5(32)-ReLU-maxpool2, conv5x5(64)-ReLU-maxpool2,
    no padding, fc -> 512-ReLU (the Proto features), fc 512 -> num_classes. The flattened size is
    64 * s * s, s = ((S - 4) // 2 - 4) // 2: 1024 for 1x28x28 (MNIST), 1600 for 3x32x32 (CIFAR), PFLlib's `dim`.

    Inputs are [B, C, S, S] or flat [B, C * S * S]; C and S are read from in_features when None."""

    def __init__(self, in_features: int, num_classes: int, in_channels: int | None = None,
                 image_size: int | None = None):
        super().__init__()
        self.in_channels, self.image_size = image_shape(in_features, in_channels, image_size)
        self.num_classes = num_classes
        side = ((self.image_size - 4) // 2 - 4) // 2
        self.conv = nn.Sequential(
            nn.Conv2d(self.in_channels, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.hidden = nn.Sequential(nn.Linear(64 * side * side, 512), nn.ReLU())
        self.head = nn.Linear(512, num_classes)

    features_and_logits = True

    def forward(self, x: torch.Tensor, features: bool | str = False):
        x = x.reshape(x.shape[0], self.in_channels, self.image_size, self.image_size)
        return _outputs(self.hidden(self.conv(x).flatten(1)), self.head, features)
