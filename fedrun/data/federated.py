"""FederatedData: every client's examples resident on one device as flat tensors.

Clients' examples are stored back to back (client c owns rows offsets[c] : offsets[c] + sizes[c]).
Two access paths, both vectorized over clients:
  * minibatches: `sample_indices` maps uniform draws [m, ..., B] to row indices in one op (with
    replacement), `shuffled_indices` walks shuffled passes over each client's rows (without);
  * full passes (evaluation, full-batch gradients): a "chunk" layout cuts each client's rows into
    chunks of `chunk_len` rows (the last one padded and masked), so a computation over all clients
    is one vmap over chunks whose memory is proportional to the real data, not to the largest client.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np
import torch
from torch import Tensor


@dataclass
class ClientSplit:
    x: Tensor  # [N, *feature_shape]
    y: Tensor  # [N] int64
    offsets: Tensor  # [C] int64
    sizes: Tensor  # [C] int64
    chunk_idx: Tensor  # [n_chunks, L] int64, row indices (padding points at a valid row)
    chunk_mask: Tensor  # [n_chunks, L] float, 1 for real rows
    chunk_client: Tensor  # [n_chunks] int64

    @classmethod
    def from_parts(cls, parts: list[tuple[np.ndarray, np.ndarray]], chunk_len: int = 256) -> "ClientSplit":
        """Builds the split from per-client (x, y) arrays."""
        sizes = np.array([len(y) for _, y in parts], dtype=np.int64)
        x = np.concatenate([p[0] for p in parts])
        y = np.concatenate([p[1] for p in parts]).astype(np.int64)
        return cls.from_flat(torch.as_tensor(x), torch.as_tensor(y), torch.as_tensor(sizes), chunk_len)

    @classmethod
    def from_flat(cls, x: Tensor, y: Tensor, sizes: Tensor, chunk_len: int = 256) -> "ClientSplit":
        """Builds the split from rows grouped by client and the number of rows of each client."""
        n_all = sizes.numpy().astype(np.int64)
        if (n_all == 0).any():
            raise ValueError(f"clients {np.flatnonzero(n_all == 0).tolist()} have no examples")
        offsets = np.concatenate([[0], np.cumsum(n_all)[:-1]]).astype(np.int64)
        L = int(min(chunk_len, n_all.max()))
        idx, mask, owner = [], [], []
        for c, (off, n) in enumerate(zip(offsets, n_all)):
            k = -(-n // L)
            rows = np.arange(k * L)
            mask.append((rows < n).reshape(k, L))
            idx.append((off + np.where(rows < n, rows, 0)).reshape(k, L))
            owner.append(np.full(k, c))
        return cls(
            x=x,
            y=y.long(),
            offsets=torch.as_tensor(offsets),
            sizes=torch.as_tensor(n_all),
            chunk_idx=torch.as_tensor(np.concatenate(idx)),
            chunk_mask=torch.as_tensor(np.concatenate(mask), dtype=torch.float32),
            chunk_client=torch.as_tensor(np.concatenate(owner)),
        )

    @property
    def num_clients(self) -> int:
        return len(self.sizes)

    def to(self, device) -> "ClientSplit":
        return ClientSplit(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def sample_indices(self, clients: Tensor, u: Tensor) -> Tensor:
        """Row indices of minibatches drawn uniformly (with replacement) from each client's rows.

        Args:
            clients: [m] client ids.
            u: [m, ..., B] uniform draws in [0, 1).
        """
        shape = (-1,) + (1,) * (u.dim() - 1)
        n = self.sizes[clients].view(shape)
        return self.offsets[clients].view(shape) + torch.minimum((u * n).long(), n - 1)

    def shuffled_indices(self, clients: Tensor, blocks: int, length: int, gen: torch.Generator,
                         used: Tensor | None = None) -> Tensor:
        """Row indices [m, blocks, length] of minibatch rows drawn WITHOUT replacement: each block
        walks fresh random permutations of its client's rows, one after another (a new one when the
        last is used up), the way a shuffling DataLoader walks epochs. A block of at most n_c rows
        repeats no row; a longer one covers every row before any row comes again.

        All permutations come from one sort: a key per (segment, row), where a segment is one
        permutation of one client's rows, sorted by key and then stably by segment. The keys are one
        draw from `gen`, in client order.

        `used` [m] (None: all `length`): the rows of each block its client reads (an epochs phase's
        steps per pass x the rows a step takes). Only the segments that start before `used[i]` in a
        block are sorted: their rows are those of the full computation bit for bit (the keys are all
        drawn, so `gen` ends where it would; a segment's order is its keys' stable order either way),
        and so are all rows before `used[i]`. A segment that starts at or after `used[i]` is not
        sorted: its positions hold the client's rows in storage order (offsets[c] + position mod n_c),
        valid rows of the client that a masked step may read and discard.
        """
        clients = clients.cpu()
        m = len(clients)
        n = self.sizes.cpu()[clients]                                   # [m]
        off = self.offsets.cpu()[clients]                               # [m]
        passes = -(-length // n)                                        # permutations per block [m]
        seg_n = n.repeat_interleave(passes * blocks)                    # [S] client, block, pass order
        keys = torch.rand(int(seg_n.sum()), generator=gen)              # every segment's keys, drawn
        seg_key = torch.cumsum(seg_n, 0) - seg_n                        # each segment's first key
        first = torch.cumsum(passes * blocks, 0) - passes * blocks      # each client's first segment
        sort = passes if used is None else torch.minimum(passes, -(-used.cpu().clamp(min=0) // n))  # per block [m]
        # the sorted segments, K of them in the same (client, block, pass) order, so their keys keep their
        # relative order: each segment's stable order is the full computation's
        kept = sort * blocks
        k_first = torch.cumsum(kept, 0) - kept                          # each client's first sorted segment
        k_client = torch.repeat_interleave(torch.arange(m), kept)       # [K]
        r = torch.arange(len(k_client)) - k_first[k_client]             # block x sort + pass
        seg = first[k_client] + r // sort[k_client] * passes[k_client] + r % sort[k_client]  # [K] of the S
        k_n = n[k_client]
        k_start = torch.cumsum(k_n, 0) - k_n                            # each sorted segment's first row in perm
        seg_id = torch.repeat_interleave(torch.arange(len(k_n)), k_n)
        local = torch.arange(len(seg_id))
        local -= k_start[seg_id]                                        # row of its client, per key
        # (the row-long tensors freed as soon as they are used: a round's draws are made at once, their peak
        # is fedrun.run.spec.ROW_BYTES["shuffled"] a drawn row)
        if used is not None:  # the sorted segments' keys alone, in their order
            at = seg_key[seg][seg_id]
            at += local
            keys = keys[at]
            del at
        order = keys.argsort(stable=True)
        del keys
        within = seg_id[order].argsort(stable=True)
        del seg_id
        order = order[within]                                           # keys sorted within each segment
        del within
        perm = local[order]
        del local, order
        # every position's row in storage order, then each block's sorted prefix (its first `sort` segments,
        # cut at `length`; one after another in perm from the block's first segment) written over it
        out = (off.view(-1, 1, 1) + torch.arange(length).view(1, 1, -1) % n.view(-1, 1, 1)).expand(
            m, blocks, length).contiguous()
        span = torch.minimum(sort * n, torch.tensor(length)).repeat_interleave(blocks)  # [m x blocks]
        b_seg = (k_first.view(-1, 1) + torch.arange(blocks) * sort.view(-1, 1)).view(-1)  # (K: a block sorting none)
        src = torch.cat([k_start, k_start.new_zeros(1)])[b_seg.clamp(max=len(k_start))]
        blk = torch.repeat_interleave(torch.arange(m * blocks), span)
        q = torch.arange(len(blk))
        q -= (torch.cumsum(span, 0) - span)[blk]                        # position within its block
        at = src[blk]
        at += q
        rows = perm[at]
        del perm, at
        rows += off.repeat_interleave(span.view(m, blocks).sum(1))
        at = blk.mul_(length)
        at += q
        del q
        out.view(-1)[at] = rows
        return out.to(self.x.device)

    def rows(self, idx: Tensor) -> tuple[Tensor, Tensor]:
        """x and y of the rows `idx` (any shape): x [*idx.shape, *feature_shape], y [*idx.shape].
        One index_select of the flattened indices (advanced indexing x[idx] took ~3x longer on the CPU)."""
        flat = idx.reshape(-1)
        return (self.x.index_select(0, flat).view(*idx.shape, *self.x.shape[1:]),
                self.y.index_select(0, flat).view(idx.shape))

    def client_rows(self, c: int) -> slice:
        off = int(self.offsets[c])
        return slice(off, off + int(self.sizes[c]))

    def label_counts(self, num_classes: int) -> Tensor:
        """[C, num_classes] number of examples of each label per client."""
        owner = torch.repeat_interleave(torch.arange(self.num_clients, device=self.y.device), self.sizes)
        counts = torch.zeros(self.num_clients * num_classes, dtype=torch.long, device=self.y.device)
        counts.index_add_(0, owner * num_classes + self.y, torch.ones_like(self.y))
        return counts.view(self.num_clients, num_classes)


@dataclass
class FederatedData:
    name: str
    train: ClientSplit
    test: ClientSplit
    num_classes: int
    augment: str | None = None  # training-batch augmentation (`augment.AUGMENTATIONS`), never at evaluation
    augment_fill: Tensor | None = None  # [channels] value the augmentation's padding takes (None: 0), on x's device
    client_classes: Tensor | None = None  # [C, k] dataset classes each client owns (ACID/ALID), CPU
    client_labels: Tensor | None = None  # [C, k] ALID: label client c gives class client_classes[c, j], CPU
    num_holdout: int = 0  # the last num_holdout clients never train (unseen clients, `partition.holdout`)
    vocab_size: int | None = None  # rows of token ids 0..vocab_size-1 (a text dataset's vocabulary); None: not ids

    @property
    def num_clients(self) -> int:
        return self.train.num_clients

    @property
    def num_train_clients(self) -> int:
        """Clients 0..num_train_clients-1 train; the rest are held out (evaluated as new clients)."""
        return self.num_clients - int(self.num_holdout)

    @property
    def feature_shape(self) -> tuple[int, ...]:
        return tuple(self.train.x.shape[1:])

    @property
    def in_features(self) -> int:
        return int(np.prod(self.feature_shape))

    def to(self, device) -> "FederatedData":
        fill = None if self.augment_fill is None else self.augment_fill.to(device)
        return replace(self, train=self.train.to(device), test=self.test.to(device), augment_fill=fill)
