"""LEAF's Shakespeare character model (Caldas et al. 2018, LEAF; McMahan et al. 2017's next-character
LSTM): embedding 8 -> 2-layer LSTM of 256 units -> linear -> the next character, predicted from the
last step's output.

The recurrence is written out as matrix products over time (`lstm_layers`) instead of calling
nn.LSTM: cuDNN's and ATen's fused LSTM kernels have no vmap batching rule, so vmapped over clients
they fall back to a per-client loop; these plain ops batch (per-client weights give batched matrix
products). nn.LSTM is kept as the holder of the weights, with its names, shapes and initialization,
so a state dict moves between the two and the test compares them on the same weights.

The vmap engine's minibatch and full-batch gradients (its hand path, branch "backward") skip vmap:
`LSTM.stacked_ce_grad`, client by client through torch's fused LSTM on the CPU, or the recurrence
batched over clients with a backward through time by hand (`_stacked_lstm_ce_grad`; branch "rnn").
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..branches import choose
from .small import _outputs


def lstm_layers(lstm: nn.LSTM, x: torch.Tensor) -> torch.Tensor:
    """The top layer's outputs [B, T, H] of `lstm` (batch_first, unidirectional, zero initial state)
    on x [B, T, in], computed as nn.LSTM does (gates i, f, g, o): the input projection of all steps
    in one product per layer, then one [B, H] x [H, 4H] product per step."""
    h_seq = x
    for layer in range(lstm.num_layers):
        w_ih, w_hh = getattr(lstm, f"weight_ih_l{layer}"), getattr(lstm, f"weight_hh_l{layer}")
        xs = h_seq @ w_ih.T
        if lstm.bias:
            xs = xs + (getattr(lstm, f"bias_ih_l{layer}") + getattr(lstm, f"bias_hh_l{layer}"))
        h = c = xs.new_zeros(xs.shape[0], lstm.hidden_size)
        outs = []
        for t in range(xs.shape[1]):
            i, f, g, o = (xs[:, t] + h @ w_hh.T).chunk(4, -1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outs.append(h)
        h_seq = torch.stack(outs, 1)
    return h_seq


class LSTM(nn.Module):
    """Next-character LSTM: int64 character ids [B, T] -> logits [B, num_classes] for character T+1.

    LEAF's Shakespeare model is the default (vocab_size 80, embed_dim 8, hidden 256, layers 2); the
    Proto features are the top layer's last output (`hidden` values). `in_features` (the sequence
    length) is accepted for the common model interface."""

    def __init__(self, in_features: int, num_classes: int, vocab_size: int = 80, embed_dim: int = 8,
                 hidden: int = 256, layers: int = 2):
        super().__init__()
        self.num_classes = num_classes
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.lstm = nn.LSTM(embed_dim, hidden, layers, batch_first=True)  # its weights; see the module docstring
        self.head = nn.Linear(hidden, num_classes)

    features_and_logits = True
    rnn: str | None = None  # branch "rnn" forced (fedrun.branches; None: the device's default)

    def forward(self, x: torch.Tensor, features: bool | str = False):
        h = lstm_layers(self.lstm, self.embedding(x))[:, -1]
        return _outputs(h, self.head, features)

    def stacked_ce_grad(self, params: dict, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None = None,
                        shared: bool = False, wrt: list | None = None) -> tuple[dict, torch.Tensor]:
        """The vmap engine's minibatch and full-batch gradients (branch "backward"), as `_stacked_ce_grad`
        of fedrun.models.small gives them: client by client through torch's fused LSTM (branch "rnn"
        fused, the CPU's default) or batched over clients (`_stacked_lstm_ce_grad`). `wrt` (None: all): the
        gradients returned; every one is computed."""
        if choose("rnn", x.device, None if self.rnn is None else {"rnn": self.rnn}) == "batched":
            g, losses = _stacked_lstm_ce_grad(self, params, x, y, weight, shared)
        else:
            g, losses = self._fused_ce_grad(params, x, y, weight, shared)
        want = None if wrt is None else set(wrt)
        return (g if want is None else {k: g[k] for k in g if k in want}), losses

    def _fused_ce_grad(self, params: dict, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None,
                       shared: bool) -> tuple[dict, torch.Tensor]:
        """`stacked_ce_grad` client by client, the recurrence through torch's fused LSTM (torch._VF.lstm,
        what nn.LSTM calls: oneDNN's kernel on the CPU for float32, cuDNN's on a GPU) and autograd. On
        the CPU a client's 2 x 1 MB of recurrent weights stay in cache through its 80 steps; batched
        over clients every step streams all clients' weights (`_stacked_lstm_ce_grad`)."""
        lstm = self.lstm
        names = [f"lstm.{n}" for n in lstm._flat_weights_names]
        grads, losses = [], []
        with torch.enable_grad():
            for i in range(x.shape[0]):
                p = {k: (v if shared else v[i]).detach().requires_grad_(True) for k, v in params.items()}
                emb = F.embedding(x[i], p["embedding.weight"])
                zeros = emb.new_zeros(lstm.num_layers, emb.shape[0], lstm.hidden_size)
                out = torch._VF.lstm(emb, (zeros, zeros), [p[n] for n in names], lstm.bias, lstm.num_layers,
                                     0.0, False, False, True)[0]
                rows = F.cross_entropy(F.linear(out[:, -1], p["head.weight"], p["head.bias"]), y[i], reduction="none")
                loss = rows.mean() if weight is None else (rows * weight[i]).sum()
                grads.append(torch.autograd.grad(loss, list(p.values())))
                losses.append(loss.detach())
        return {k: torch.stack([g[j] for g in grads]) for j, k in enumerate(params)}, torch.stack(losses)


def _stacked_lstm_ce_grad(model: "LSTM", params: dict, x: torch.Tensor, y: torch.Tensor,
                          weight: torch.Tensor | None = None, shared: bool = False) -> tuple[dict, torch.Tensor]:
    """Per-client gradients of the LSTM's cross-entropy on ids x [m, B, T], y [m, B], and the losses
    [m] (the mean over the B rows, or with `weight` [m, B] the weighted sum), as `_stacked_ce_grad`
    of fedrun.models.small gives them for the fully connected models; `shared`: one unstacked model
    for all m (the gradients are still per client).

    The forward is `lstm_layers`'s (gates i, f, g, o; the input projection of all steps in one
    product per layer), batched over the m clients: one [m, B, H] x [m, H, 4H] product per step. The
    backward goes through time by hand, as fused LSTM kernels do: per step only dh @ W_hh; the
    weights' gradients are ONE product per matrix over all steps and rows (autograd's graph of the
    unrolled recurrence adds T products of K = B into each weight's gradient)."""
    m, b, steps = x.shape
    lstm = model.lstm

    def w(name):  # a weight as [m or 1, ...], so that matmul broadcasts over the clients
        v = params[name]
        return v.unsqueeze(0) if shared else v

    emb = params["embedding.weight"]
    h_seq = emb[x] if shared else emb[torch.arange(m, device=x.device).view(m, 1, 1), x]  # [m, B, T, E]
    saved = []  # per layer: its input [m, B, T, in], gate activations [m, B, T, 4H], cells, outputs
    for layer in range(lstm.num_layers):
        w_ih, w_hh = w(f"lstm.weight_ih_l{layer}"), w(f"lstm.weight_hh_l{layer}")
        xs = torch.matmul(h_seq.flatten(1, 2), w_ih.transpose(-1, -2))  # [m, B * T, 4H]
        if lstm.bias:
            xs = xs + (w(f"lstm.bias_ih_l{layer}") + w(f"lstm.bias_hh_l{layer}")).unsqueeze(1)
        xs = xs.view(m, b, steps, -1)
        hid = w_hh.shape[-1]
        acts, cells, outs = torch.empty_like(xs), xs.new_empty(m, b, steps, hid), xs.new_empty(m, b, steps, hid)
        h = c = xs.new_zeros(m, b, hid)
        w_hh_t = w_hh.transpose(-1, -2)
        for t in range(steps):
            a = acts[:, :, t]
            torch.add(xs[:, :, t], torch.matmul(h, w_hh_t), out=a)  # the gates, then their activations
            i, f, g, o = a.chunk(4, -1)
            i.sigmoid_(), f.sigmoid_(), g.tanh_(), o.sigmoid_()
            c = f * c + i * g
            h = o * torch.tanh(c)
            cells[:, :, t], outs[:, :, t] = c, h
        saved.append((h_seq, acts, cells, outs))
        h_seq = outs

    top = h_seq[:, :, -1]  # [m, B, H]
    wh, bh = w("head.weight"), w("head.bias")
    z = torch.matmul(top, wh.transpose(-1, -2)) + bh.unsqueeze(1)  # [m, B, classes]
    logp = torch.log_softmax(z, -1)
    target = y.unsqueeze(-1)
    nll = -logp.gather(-1, target).squeeze(-1)
    dz = logp.exp_().scatter_add_(-1, target, torch.full(target.shape, -1.0, dtype=logp.dtype, device=z.device))
    if weight is None:  # d(mean loss)/d logits = (softmax - onehot) / B
        losses = nll.mean(1)
        dz = dz.mul_(1.0 / b)
    else:
        losses = (nll * weight).sum(1)
        dz = dz.mul_(weight.unsqueeze(-1))
    grads = {"head.weight": torch.matmul(dz.transpose(1, 2), top), "head.bias": dz.sum(1)}
    dh_out = None  # the gradient of the layer's outputs at every step (the top layer: the last step's only)
    dh_last = torch.matmul(dz, wh)
    for layer in range(lstm.num_layers - 1, -1, -1):
        inp, acts, cells, outs = saved[layer]
        w_ih, w_hh = w(f"lstm.weight_ih_l{layer}"), w(f"lstm.weight_hh_l{layer}")
        hid = w_hh.shape[-1]
        dgates = torch.empty_like(acts)
        dh = dh_last if dh_out is None else None
        dc = torch.zeros_like(cells[:, :, 0])
        for t in range(steps - 1, -1, -1):
            if dh_out is not None:
                dh = dh_out[:, :, t] if t == steps - 1 else dh + dh_out[:, :, t]
            i, f, g, o = acts[:, :, t].chunk(4, -1)
            tc = torch.tanh(cells[:, :, t])
            dc = dc + dh * o * (1 - tc * tc)
            c_prev = cells[:, :, t - 1] if t else torch.zeros_like(dc)
            d = dgates[:, :, t]
            di, df, dg, do = d.chunk(4, -1)
            torch.mul(dc * g, i * (1 - i), out=di)
            torch.mul(dc * c_prev, f * (1 - f), out=df)
            torch.mul(dc * i, 1 - g * g, out=dg)
            torch.mul(dh * tc, o * (1 - o), out=do)
            dc = dc * f
            if t:
                dh = torch.matmul(d, w_hh)
        flat_d = dgates.flatten(1, 2)  # [m, B*T, 4H]
        h_prev = torch.cat([outs.new_zeros(m, b, 1, hid), outs[:, :, :-1]], 2).flatten(1, 2)
        grads[f"lstm.weight_hh_l{layer}"] = torch.bmm(flat_d.transpose(1, 2), h_prev)
        grads[f"lstm.weight_ih_l{layer}"] = torch.bmm(flat_d.transpose(1, 2), inp.flatten(1, 2))
        if lstm.bias:
            grads[f"lstm.bias_ih_l{layer}"] = flat_d.sum(1)
            grads[f"lstm.bias_hh_l{layer}"] = grads[f"lstm.bias_ih_l{layer}"].clone()
        dh_out = torch.matmul(flat_d, w_ih).view(m, b, steps, -1)  # the layer below's outputs' gradient
    ids = x.flatten(1)
    g_emb = dh_out.new_zeros(m, *params["embedding.weight"].shape[-2:])
    grads["embedding.weight"] = g_emb.scatter_add_(1, ids.unsqueeze(-1).expand(-1, -1, g_emb.shape[-1]),
                                                   dh_out.flatten(1, 2))
    return {k: grads[k] for k in params}, losses
