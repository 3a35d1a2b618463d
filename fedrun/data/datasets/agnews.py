"""AG News (Zhang et al. 2015, the `ag_news_csv` release): 120,000 training and 7,600 test news
articles, 4 classes (World, Sports, Business, Sci/Tech), each a CSV row `"class 1-4","title",
"description"`. A row's text (title, a space, description) is lowercased and cut into tokens by
`TOKEN` (runs of letters/digits with inner apostrophes, or one punctuation mark); the vocabulary is
the `vocab_size - 2` most frequent tokens of the TRAINING rows (ties by the token's text), after
id 0 (padding) and id 1 (a token outside the vocabulary), or all of them when the rows hold fewer
(then the ids, and a text model's embedding that follows the dataset's, number len + 2: `Rows.vocab_size`,
which fedrun says in one line); each row is its first `max_len` ids, padded
with 0. Test rows never shape the vocabulary. Rows are int64 token ids [N, max_len], what the text
models (fedrun.models.text) take; labels 0..3.

Files: `root`/ag_news_csv/{train.csv,test.csv}; downloaded (fast.ai's copy of the release) when
missing and `download` is set. The vocabulary is built at load time from the files, so a run needs
no network and no tokenizer package.
"""
from __future__ import annotations

import csv
import html
import os
import re
from collections import Counter

import numpy as np

from ...device import physical_memory
from ...errors import DataCorruptError, DataMissingError
from .base import Dataset, Rows, all_present, choice, corrupt, download_into

FOLDER = "ag_news_csv"
FILES = ["train.csv", "test.csv"]
URL = "https://s3.amazonaws.com/fast-ai-nlp/ag_news_csv.tgz"  # the release as fast.ai mirrors it
CLASSES = 4
PAD, UNK = 0, 1
RELEASE_ROWS = 127_600  # 120,000 training + 7,600 test rows
TOKEN_BYTES = 16  # a token id (int64) in the encoded rows and again in the clients' concatenation (fedrun.data.cache)
TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z0-9]+)*|[^\sa-z0-9]")


def clean(text: str) -> str:
    """The release's escapes undone: `\\` line breaks as spaces, `#39;`-style entities (their `&`
    lost) and HTML entities as their characters."""
    text = text.replace("\\n", " ").replace("\\", " ")
    text = re.sub(r"(?<!&)#(\d{1,5});", lambda m: chr(int(m.group(1))), text)
    return html.unescape(text)


def tokens(text: str) -> list[str]:
    """The tokens of one row's text (see the module docstring)."""
    return TOKEN.findall(clean(text).lower())


def read_agnews_csv(path: str) -> tuple[list[str], np.ndarray]:
    """(texts, labels 0..3) of one ag_news_csv file; a file that is not that format is one line."""
    texts, labels = [], []
    try:
        with open(path, newline="", encoding="utf-8") as f:
            for n, row in enumerate(csv.reader(f), 1):
                if len(row) < 2 or not row[0].strip().isdigit() or not 1 <= int(row[0]) <= CLASSES:
                    raise DataCorruptError(corrupt(path, f"not an ag_news_csv file: line {n} is not "
                                                         f"\"class 1-{CLASSES}\",\"title\",\"description\" "
                                                         f"({str(row)[:60]})"))
                labels.append(int(row[0]) - 1)
                texts.append(" ".join(row[1:]))
    except (UnicodeDecodeError, csv.Error) as e:
        raise DataCorruptError(corrupt(path, f"not an ag_news_csv file ({type(e).__name__}: {str(e)[:100]})")) from None
    if not labels:
        raise DataCorruptError(corrupt(path, "an ag_news_csv file with no rows"))
    return texts, np.asarray(labels, dtype=np.int64)


def build_vocab(texts: list[list[str]], vocab_size: int) -> dict[str, int]:
    """token -> id for the `vocab_size - 2` most frequent tokens of `texts` (ties by the token), ids from 2;
    all of them when `texts` hold fewer distinct tokens (the vocabulary is then len + 2 ids, not vocab_size)."""
    counts = Counter(t for row in texts for t in row)
    kept = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: vocab_size - 2]
    return {t: i + 2 for i, (t, _) in enumerate(kept)}


def encode(texts: list[list[str]], vocab: dict[str, int], max_len: int) -> np.ndarray:
    """int64 [len(texts), max_len]: each row's first max_len ids (UNK outside `vocab`), 0-padded."""
    out = np.zeros((len(texts), max_len), dtype=np.int64)
    for i, row in enumerate(texts):
        ids = [vocab.get(t, UNK) for t in row[:max_len]]
        out[i, : len(ids)] = ids
    return out


class AgNews(Dataset):
    """`dataset=agnews` (conf/dataset): `root`/ag_news_csv/{train,test}.csv."""

    def __init__(self, name: str = "agnews", root: str = "data", download: bool = True, vocab_size: int = 30000,
                 max_len: int = 200) -> None:
        choice("dataset.name", name, ["agnews"])
        for option, value, low in (("dataset.vocab_size", vocab_size, 3), ("dataset.max_len", max_len, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{option}={value!r}: allowed an integer >= {low}")
        limit = physical_memory() // 4
        if limit and RELEASE_ROWS * max_len * TOKEN_BYTES > limit:
            raise ValueError(f"dataset.max_len={max_len}: the release's {RELEASE_ROWS:,} rows of max_len token ids "
                             f"would take {RELEASE_ROWS * max_len * TOKEN_BYTES / 2**30:.0f} GiB, more than a quarter "
                             f"of this machine's {physical_memory() / 2**30:.0f} GiB; allowed: "
                             f"1..{limit // (RELEASE_ROWS * TOKEN_BYTES)} (rows longer are cut; PFLlib: 200)")
        super().__init__(root, download)
        self.name, self.vocab_size, self.max_len = name, vocab_size, max_len

    num_classes = CLASSES

    def settings(self) -> dict:
        # the rows' vocabulary is capped at the training rows' distinct tokens (+ 2): a cache file from
        # before the cap holds no count, and its model would take vocab_size embedding rows
        return {**super().settings(), "vocab": "capped at the corpus"}

    def files(self) -> dict[str, str | None]:
        return {f: os.path.join(os.path.abspath(self.root), FOLDER, f) for f in FILES}

    def load(self) -> Rows:
        base = os.path.join(self.root, FOLDER)
        if not all_present(base, FILES):
            why = "download=false"
            if self.download:
                from torchvision.datasets.utils import download_and_extract_archive

                why = download_into(self.root, [FOLDER, os.path.basename(URL)], lambda: download_and_extract_archive(
                    URL, self.root, remove_finished=True)) or why
            if not all_present(base, FILES):
                raise DataMissingError(
                    f"AG News not found: expected {', '.join(FILES)} in {os.path.abspath(base)} ({why}); copy the "
                    f"ag_news_csv release there ({URL}) or point dataset.root (or $FEDRUN_DATA) at the folder that "
                    f"holds {FOLDER}")
        (train, try_), (test, tey) = (read_agnews_csv(os.path.join(base, f)) for f in FILES)
        train, test = [tokens(t) for t in train], [tokens(t) for t in test]
        vocab = build_vocab(train, self.vocab_size)
        return Rows(encode(train, vocab, self.max_len), try_, encode(test, vocab, self.max_len), tey, CLASSES,
                    vocab_size=len(vocab) + 2)
