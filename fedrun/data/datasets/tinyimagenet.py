"""Tiny-ImageNet (the CS231n release, tiny-imagenet-200): 64 x 64 colour images of 200 ImageNet
classes, 500 training and 50 validation images per class. The labelled validation images are the
test rows (the release's test images carry no labels), as PFLlib and FL-bench use them. Rows are
float32 [N, 3, 64, 64] normalized per channel by the training set's mean and std; training batches
random-crop (pad 4) + flip augmented as CIFAR's (`augment.crop_flip`, padding black).

Layout: `root`/tiny-imagenet-200/wnids.txt (the 200 class ids, line order = label),
train/<wnid>/images/*.JPEG, val/val_annotations.txt (`file<TAB>wnid<TAB>box...`) + val/images/*.JPEG;
downloaded (the Stanford zip, ~240 MB) when missing and `download` is set. wnids.txt may list at most
the model's 200 outputs (labels are its line numbers), each class once, and every class folder of
train/; fewer than 200 is read as a subset (labels 0..k-1 of the 200 outputs). Anything else is
refused in one line naming the file (`read_wnids`). Decoding 110,000 JPEGs
takes a minute or two once; the data cache keeps the result. The rows in float32 take ~5 GB
(training) on the run's device.
"""
from __future__ import annotations

import os

import numpy as np

from ...errors import DataCorruptError, DataMissingError
from .base import Dataset, Rows, choice, corrupt, download_into
from .cifar import channel_stats

FOLDER = "tiny-imagenet-200"
URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
SIDE = 64
NUM_CLASSES = 200
PARTS = ["wnids.txt", "train", os.path.join("val", "val_annotations.txt"), os.path.join("val", "images")]


def _image(path: str) -> np.ndarray:
    """uint8 [3, 64, 64] of one JPEG (grey ones, a few in the release, as RGB)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            a = np.asarray(im.convert("RGB"), dtype=np.uint8)
    except (OSError, UnidentifiedImageError, ValueError) as e:
        raise DataCorruptError(corrupt(path, f"not a readable image ({type(e).__name__}: {str(e)[:100]})")) from None
    if a.shape != (SIDE, SIDE, 3):
        raise DataCorruptError(corrupt(path, f"a {a.shape[1]} x {a.shape[0]} image, "
                                             f"not Tiny-ImageNet's {SIDE} x {SIDE}"))
    return a.transpose(2, 0, 1)


def _stack(paths: list[str]) -> np.ndarray:
    out = np.empty((len(paths), 3, SIDE, SIDE), dtype=np.uint8)
    for i, p in enumerate(paths):
        out[i] = _image(p)
    return out


def _lines(path: str) -> list[str]:
    """The lines of one of the release's index files (ASCII); one that is not text is one line naming it."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.readlines()
    except UnicodeDecodeError as e:
        raise DataCorruptError(corrupt(path, f"not a text file of the release (byte {e.start}: "
                                             f"{e.object[e.start:e.start + 1]!r} is not UTF-8)")) from None


def _plain(name: str) -> bool:
    """A file or folder name inside one folder: no separator, not . or .. (nothing outside the release is read)."""
    return bool(name) and name not in (".", "..") and "/" not in name and os.sep not in name


def read_wnids(path: str, train: str) -> list[str]:
    """The class ids of wnids.txt, line order = label. Refused in one line naming the file: not text,
    no classes, a class listed twice (its images would be read twice, under the later label, and the
    earlier label would have none), more than the model's NUM_CLASSES outputs, a line that is not a
    folder name, or a class folder in `train` it does not list (a torn copy). Fewer than NUM_CLASSES
    is a subset of the release, read as labels 0..k-1 of the model's NUM_CLASSES outputs."""
    wnids = [w.strip() for w in _lines(path)]
    lines = [i for i, w in enumerate(wnids, 1) if w]
    wnids = [w for w in wnids if w]
    if not wnids:
        raise DataCorruptError(corrupt(path, "an empty wnids.txt (no class ids)"))
    first = {}
    for n, w in zip(lines, wnids):
        if not _plain(w) or any(c.isspace() for c in w):
            raise DataCorruptError(corrupt(path, f"not Tiny-ImageNet's wnids.txt: line {n} is not a class id "
                                                 f"({w[:60]!r})"))
        if w in first:
            raise DataCorruptError(corrupt(path, f"not Tiny-ImageNet's wnids.txt: class {w} is listed twice "
                                                 f"(lines {first[w]} and {n})"))
        first[w] = n
    if len(wnids) > NUM_CLASSES:
        raise DataCorruptError(corrupt(path, f"not Tiny-ImageNet's wnids.txt: it lists {len(wnids)} classes, the "
                                             f"release {NUM_CLASSES} (the model's outputs)"))
    extra = sorted(set(os.listdir(train)) - set(wnids)) if os.path.isdir(train) else []
    extra = [e for e in extra if os.path.isdir(os.path.join(train, e))]
    if extra:
        raise DataCorruptError(corrupt(path, f"not the wnids.txt of {os.path.abspath(train)}: it lists {len(wnids)} "
                                             f"classes, and {len(extra)} class folder{'s' if len(extra) > 1 else ''} "
                                             f"there {'are' if len(extra) > 1 else 'is'} not among them "
                                             f"(e.g. {extra[0]}; a torn copy?)"))
    return wnids


def tinyimagenet_files(root: str) -> tuple[list[str], np.ndarray, list[str], np.ndarray]:
    """(train paths, train labels, val paths, val labels) of the release under `root`, labels by
    wnids.txt's order; files sorted by name (the order is fixed across copies)."""
    base = os.path.join(root, FOLDER)
    wnids = read_wnids(os.path.join(base, "wnids.txt"), os.path.join(base, "train"))
    label = {w: i for i, w in enumerate(wnids)}
    trp, trl = [], []
    for w in wnids:
        d = os.path.join(base, "train", w, "images")
        names = sorted(n for n in os.listdir(d) if n.lower().endswith((".jpeg", ".jpg"))) if os.path.isdir(d) else []
        if not names:
            raise DataMissingError(f"Tiny-ImageNet incomplete: no training images in {os.path.abspath(d)} "
                                   f"(class {w} of wnids.txt); copy the whole tiny-imagenet-200 folder again")
        trp += [os.path.join(d, n) for n in names]
        trl += [label[w]] * len(names)
    vap, val = [], []
    ann = os.path.join(base, "val", "val_annotations.txt")
    seen = {}
    for n, line in enumerate(_lines(ann), 1):
        cols = line.rstrip("\n").split("\t")
        if not line.strip():
            continue
        if len(cols) < 2 or not _plain(cols[0]) or cols[1] not in label:
            raise DataCorruptError(corrupt(ann, f"not Tiny-ImageNet's val_annotations.txt: line {n} is not "
                                                f"'<file>\\t<wnid of wnids.txt>...' ({line.strip()[:60]!r})"))
        if cols[0] in seen:  # the same image twice would be two test rows
            raise DataCorruptError(corrupt(ann, f"not Tiny-ImageNet's val_annotations.txt: {cols[0]!r} is listed "
                                                f"twice (lines {seen[cols[0]]} and {n})"))
        seen[cols[0]] = n
        vap.append(os.path.join(base, "val", "images", cols[0]))
        if not os.path.isfile(vap[-1]):
            raise DataMissingError(f"Tiny-ImageNet incomplete: {os.path.abspath(vap[-1])}, line {n} of "
                                   f"{os.path.abspath(ann)}, is not there; copy the whole tiny-imagenet-200 folder "
                                   f"again")
        val.append(label[cols[1]])
    order = np.argsort(vap, kind="stable")
    return trp, np.asarray(trl, dtype=np.int64), [vap[i] for i in order], np.asarray(val, dtype=np.int64)[order]


class TinyImageNet(Dataset):
    """`dataset=tinyimagenet` (conf/dataset): `root`/tiny-imagenet-200 in the release's layout."""

    augment = "crop_flip"
    num_classes = NUM_CLASSES

    def __init__(self, name: str = "tinyimagenet", root: str = "data", download: bool = True) -> None:
        choice("dataset.name", name, ["tinyimagenet"])
        super().__init__(root, download)
        self.name = name

    def files(self) -> dict[str, str | None]:
        # the two index files; the images are keyed by their count and names through them (hashing
        # 110,000 JPEGs on every run would cost more than decoding them)
        base = os.path.join(os.path.abspath(self.root), FOLDER)
        return {f: os.path.join(base, f) for f in ("wnids.txt", os.path.join("val", "val_annotations.txt"))}

    def load(self) -> Rows:
        base = os.path.join(self.root, FOLDER)
        present = lambda: all(os.path.exists(os.path.join(base, p)) for p in PARTS)
        if not present():
            why = "download=false"
            if self.download:
                from torchvision.datasets.utils import download_and_extract_archive

                why = download_into(self.root, [FOLDER, os.path.basename(URL)], lambda: download_and_extract_archive(
                    URL, self.root, remove_finished=True)) or why
            if not present():
                raise DataMissingError(
                    f"Tiny-ImageNet not found: expected {', '.join(PARTS)} in {os.path.abspath(base)} ({why}); "
                    f"unzip {URL} there or point dataset.root (or $FEDRUN_DATA) at the folder that holds {FOLDER}")
        trp, try_, tep, tey = tinyimagenet_files(self.root)
        trx, tex = _stack(trp), _stack(tep)
        mean, std = channel_stats(trx)
        mean, std = mean.astype(np.float32)[:, None, None], std.astype(np.float32)[:, None, None]

        def norm(x):  # in place on the float copy: one 5 GB array at a time, not three
            y = x.astype(np.float32)
            y -= mean
            y /= std
            return y

        return Rows(norm(trx), try_, norm(tex), tey, self.num_classes, augment_fill=(-mean / std).reshape(-1))
