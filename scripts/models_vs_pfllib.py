"""fedrun's models against PFLlib's (TsingZ0/PFLlib, system/flcore/trainmodel/) and torchvision's:
parameter counts, and where the architectures are the same, the largest output difference on one
batch with PFLlib's weights copied into fedrun's model (float64, eval mode, no dropout).

    python scripts/models_vs_pfllib.py /path/to/PFLlib

Needs a PFLlib checkout (its code stays outside fedrun) and torchvision. The numbers are in
docs/models.md.
"""
from __future__ import annotations

import os
import sys

import torch
from torch import nn


def copy(src: nn.Module, dst: nn.Module, rename=lambda k: k) -> None:
    """src's weights into dst: by name after `rename` when the names match, else in order (shapes checked).
    Entries renamed to None are left out (PFLlib's position-encoding buffer: fedrun computes it)."""
    s, d = src.state_dict(), dst.state_dict()
    s = {rename(k): v for k, v in s.items() if not k.endswith("num_batches_tracked")}
    s.pop(None, None)
    d_keys = [k for k in d if not k.endswith("num_batches_tracked")]
    if set(s) != set(d_keys):
        s = dict(zip(d_keys, s.values()))
    for k, v in s.items():
        assert d[k].shape == v.shape, (k, d[k].shape, v.shape)
    dst.load_state_dict(s, strict=False)


def count(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def compare(name: str, ref: nn.Module, mine: nn.Module, x: torch.Tensor, ref_out=None, mine_out=None) -> None:
    ref, mine = ref.double().eval(), mine.double().eval()
    with torch.no_grad():
        a = (ref_out or ref)(x)
        b = (mine_out or mine)(x)
    print(f"| {name} | {count(ref):,} | {count(mine):,} | {(a - b).abs().max().item():.1e} |")


def main(pfllib: str) -> None:
    sys.path.insert(0, os.path.join(pfllib, "system"))
    import torchvision
    from flcore.trainmodel.models import FedAvgCNN as PCNN
    from flcore.trainmodel.models import LSTMNet, fastText
    from flcore.trainmodel.models import TextCNN as PTextCNN
    from flcore.trainmodel.resnet import resnet10 as presnet10
    from flcore.trainmodel.transformer import TransformerModel

    from fedrun.models import LSTM, FastText, FedAvgCNN, ResNet10, ResNet18, ResNet34, TextCNN, Transformer
    from fedrun.models.rnn import lstm_layers

    torch.manual_seed(0)
    print("| model | reference params | fedrun params | max abs output difference |")
    print("|---|---|---|---|")
    for shape, dim in (((1, 28, 28), 1024), ((3, 32, 32), 1600)):
        ref, mine = PCNN(shape[0], 10, dim), FedAvgCNN(shape[0] * shape[1] * shape[2], 10)
        copy(ref, mine)
        compare(f"FedAvgCNN {'x'.join(map(str, shape))}", ref, mine, torch.randn(8, *shape, dtype=torch.float64))

    # ResNets: the reference with the CIFAR stem put in (3x3 conv, stride 1, no max-pool), so the blocks are compared
    x = torch.randn(4, 3, 32, 32, dtype=torch.float64)
    for label, ref, mine in (("torchvision resnet18 (PFLlib ResNet18)", torchvision.models.resnet18(num_classes=10),
                              ResNet18(3072, 10)),
                             ("torchvision resnet34 (PFLlib ResNet34)", torchvision.models.resnet34(num_classes=10),
                              ResNet34(3072, 10)),
                             ("PFLlib resnet10", presnet10(num_classes=10), ResNet10(3072, 10))):
        print(f"| {label}, ImageNet stem as is | {count(ref):,} | {count(mine):,} | (not the same stem) |")
        ref.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        ref.maxpool = nn.Identity()
        copy(ref, mine)
        compare(f"{label}, CIFAR stem put in, BatchNorm", ref, mine, x)

    tokens = torch.randint(1, 1000, (6, 40))  # no padding: PFLlib's models attend to and average over it
    ref, mine = fastText(64, vocab_size=1000, num_classes=4), FastText(40, 4, vocab_size=1000, dim=64)
    copy(ref, mine, lambda k: k.replace("fc1", "hidden").replace("fc.", "head."))
    compare("fastText (log-softmax taken of both)", ref, mine, tokens,
            mine_out=lambda t: torch.log_softmax(mine(t), 1))
    ref = PTextCNN(64, num_channels=16, max_len=40, vocab_size=1000, num_classes=4)
    mine = TextCNN(40, 4, vocab_size=1000, dim=64, channels=16)
    copy(ref, mine)
    compare("TextCNN (log-softmax taken of both)", ref, mine, tokens, mine_out=lambda t: torch.log_softmax(mine(t), 1))
    ref = TransformerModel(1000, 128, 8, 2, 4, dropout=0.0, max_len=40, d_hid=512)
    mine = Transformer(40, 4, vocab_size=1000, dim=128, heads=8, layers=2, ff=512, pool="first")

    def rename(k: str) -> str | None:
        return None if k.startswith("pos_encoder.") else (k.replace("encoder.layers", "layers")
                .replace("self_attn.in_proj_", "in_proj.").replace("self_attn.", "").replace("fc.", "head."))

    copy(ref, mine, rename)
    compare("Transformer (pool=first: PFLlib's first token)", ref, mine, tokens)
    # PFLlib's position table is computed in float32 (a buffer made at construction); in float64, as fedrun's:
    from fedrun.models.text import positions
    ref.pos_encoder.pe = positions(ref.pos_encoder.pe.shape[1], 128, ref.pos_encoder.pe.double()).unsqueeze(0)
    compare("Transformer, PFLlib's position table recomputed in float64", ref, mine, tokens)

    ref = LSTMNet(256, num_layers=2, dropout=0.0, vocab_size=80, num_classes=80)
    mine = LSTM(80, 80, vocab_size=80, embed_dim=256, hidden=256, layers=2)
    copy(ref, mine, lambda k: k.replace("fc.", "head."))
    chars = torch.randint(0, 80, (6, 80))
    compare("LSTMNet's LSTM (recurrence only; embed 256)", ref, mine, chars,
            ref_out=lambda t: ref.lstm(ref.embedding(t))[0],
            mine_out=lambda t: lstm_layers(mine.lstm, mine.embedding(t)))
    print(f"| LEAF Shakespeare LSTM (fedrun default) | 817,872 (LEAF, one bias per gate) | "
          f"{count(LSTM(80, 80)):,} | - |")


if __name__ == "__main__":
    main(sys.argv[1])
