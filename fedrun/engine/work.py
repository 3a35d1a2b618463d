"""Per-client steps whose cost follows the work done: clients of different step counts (local epochs
over uneven clients, test-time fine-tuning in epochs) computed as a shrinking prefix of the clients
sorted by their counts, still vectorized, instead of every client stepping for the largest count with
a mask."""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from .tree import tree_leaves, tree_map


def clients_slice(tree, i: int, j: int):
    """Clients i..j-1 of a tree whose leaves lead with the client dimension (None leaves stay None)."""
    return tree_map(lambda v: v if v is None else v[i:j], tree)


def cat_clients(parts: list):
    """Several trees (leading dim = clients; e.g. several replicas' Local and draws) as one, joined
    along the client dimension."""
    if len(parts) == 1:
        return parts[0]
    return tree_map(lambda *vs: vs[0] if vs[0] is None else torch.cat(vs), *parts)


def clients_at(tree, ids: Tensor):
    """The clients `ids` (host positions) of a tree whose leaves lead with the client dimension (None
    leaves stay None); `ids` is copied once to each device the leaves are on."""
    on = {}

    def take(v):
        if v is None:
            return v
        if v.device not in on:
            on[v.device] = ids.to(v.device)
        return v[on[v.device]]
    return tree_map(take, tree)


def steps_by_work(state, draws, per_pass: Tensor, epochs: int, step: Callable):
    """`epochs` passes of per-client steps at the cost of the work done: the clients sorted by their
    steps per pass `per_pass` [m] (host-known; most first, stable), each step computes only the
    clients still in the pass, a prefix of them; the clients that finished a pass wait aside until
    the next one. Torch's ops are per client, so each client's numbers are those of the masked
    computation (every client stepping for the largest count, the finished ones left as they were);
    the cost is the sum of the clients' steps, not m x the largest.

    `state` and `draws` are trees whose leaves lead with the same m clients (None leaves stay None);
    the draws' leaves are [m, S, ...], S = `epochs` x a pass's length (at least the largest of
    `per_pass`: it may be set by more clients than these). `step(state, draw)` is one step of the
    clients of `state` on `draw`, the draws' column of that step for those clients (contiguous).
    Returns the state, its clients in the given order."""
    order = torch.argsort(per_pass, descending=True, stable=True)
    counts = per_pass[order].tolist()
    m, longest = len(counts), max(counts, default=0)
    stride = next(v for v in tree_leaves(draws) if v is not None).shape[1] // epochs
    state, draws = clients_at(state, order), clients_at(draws, order)
    lives = [sum(1 for c in counts if c > s) for s in range(longest)]  # clients still in the pass at step s
    for e in range(epochs if longest else 0):
        parts, n = [], m
        for s in range(longest):
            live = lives[s]
            if live < n:  # the clients from `live` on are done with this pass
                parts.append(clients_slice(state, live, n))
                state, n = clients_slice(state, 0, live), live
            if n == 0:
                break
            t = e * stride + s
            state = step(state, tree_map(lambda v: v if v is None else v[:n, t].contiguous(), draws))
        state = cat_clients([state, *reversed(parts)]) if parts else state
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(m)
    return clients_at(state, inverse)
