"""LEAF's Shakespeare (Caldas et al. 2018; McMahan et al. 2017's next-character task): every line of
a speaking role of the plays, cut into 80-character windows, each labelled by the character after it;
the rows are grouped by role, so `partition=natural` gives one client per role (1,129 roles in the
LEAF paper's full set).

Characters are indices into LEAF's 80-character alphabet (`LETTERS`, the string of LEAF's
models/utils/language_utils.py, which PFLlib copies), as LEAF's and PFLlib's `word_to_indices` and
`letter_to_index` map them. A character outside it (LEAF's `find` gives -1, an index no embedding
has) becomes the space, so every row is valid input for an 80-entry embedding.
JSON only: nothing in the files can run code; fedrun never downloads LEAF data.
"""
from __future__ import annotations

import numpy as np

from .base import Dataset, Rows, choice
from .leaf import leaf_blob, leaf_files, load_leaf

# LEAF's alphabet (models/utils/language_utils.py ALL_LETTERS): 80 characters, a character's id its position.
LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
SEQ_LEN = 80  # characters per row (LEAF's windows)
_TABLE = np.full(256, LETTERS.index(" "), dtype=np.int64)  # latin-1 lookup; the rest: space
for _i, _c in enumerate(LETTERS):
    _TABLE[ord(_c)] = _i


def char_ids(text: str) -> np.ndarray:
    """int64 ids of `text`'s characters in LEAF's alphabet; a character outside it is the space's id."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
    return np.where(codes < 256, _TABLE[np.minimum(codes, 255)], _TABLE[ord(" ")])


class Shakespeare(Dataset):
    """`dataset=shakespeare` (conf/dataset): `root`/shakespeare/data/{train,test}/*.json, as LEAF's
    data/shakespeare/preprocess.sh writes them."""

    has_groups = True
    num_classes = len(LETTERS)  # the next character
    vocab_size = len(LETTERS)

    def __init__(self, name: str = "shakespeare", root: str = "data", download: bool = False) -> None:
        choice("dataset.name", name, ["shakespeare"])  # download: taken, never acted on (LEAF's files are not fetched)
        super().__init__(root, download)
        self.name = name

    def files(self) -> dict[str, str | None]:
        return leaf_files(self.root, self.name)

    def load(self) -> Rows:
        trx, try_, trw, tex, tey, tew = load_leaf(self.root, self.name, users_of=shakespeare_users)
        return Rows(trx, try_, tex, tey, self.num_classes, groups=(trw, tew))


def shakespeare_users(path: str, dataset: str = "shakespeare"):
    """(user, x int64 [n, 80], y int64 [n]) of each role in one LEAF Shakespeare JSON file: x the
    80-character windows as ids, y the next character's id; a file that is not that is one line."""
    users, data, counts, bad = leaf_blob(path, dataset)
    out = []
    for i, user in enumerate(users):
        u = data.get(user) if isinstance(user, str) else None
        if not isinstance(u, dict) or not isinstance(u.get("x"), list) or not isinstance(u.get("y"), list):
            raise bad(f"not a LEAF user file: user {user!r} has no x and y lists in user_data")
        xs, ys = u["x"], u["y"]
        if len(xs) != len(ys):
            raise bad(f"not a LEAF user file: user {user!r} has {len(xs)} rows of x but {len(ys)} of y")
        if counts is not None and counts[i] != len(ys):
            raise bad(f"a LEAF user file whose metadata contradicts its rows: \"num_samples\" gives user {user!r} "
                      f"{counts[i]!r} rows, its user_data holds {len(ys)}")
        wrong = next((r for r in xs if not isinstance(r, str) or len(r) != SEQ_LEN), None)
        if wrong is not None:
            raise bad(f"not {dataset} rows: user {user!r} has an x that is not a string of {SEQ_LEN} characters "
                      f"({wrong!r:.40})")
        wrong = next((c for c in ys if not isinstance(c, str) or len(c) != 1), None)
        if wrong is not None:
            raise bad(f"not {dataset} rows: user {user!r} has a y that is not one character ({wrong!r:.40})")
        x = char_ids("".join(xs)).reshape(len(xs), SEQ_LEN)
        y = char_ids("".join(ys))
        out.append((user, x, y))
    return out
