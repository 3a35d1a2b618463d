"""dataset=shakespeare, agnews, tinyimagenet and cifar100 (labels=coarse): each read from tiny files
written here in the release's own format (LEAF's JSON, the ag_news_csv CSV, the tiny-imagenet-200
folders of JPEGs, CIFAR-100's python pickles with coarse_labels), composed with every partition,
the missing-files lines, and one `fedrun` run per dataset with its model."""
from __future__ import annotations

import csv
import json
import os
import pickle

import numpy as np
import pytest
from helpers import compose_data as composed
from helpers import fedrun, group_options

from fedrun.data.datasets.agnews import PAD, UNK, tokens
from fedrun.data.datasets.shakespeare import LETTERS
from fedrun.errors import DataCorruptError, DataMissingError

# ----------------------------------------------------------------------------------------------
# writers of tiny files in the real formats
# ----------------------------------------------------------------------------------------------

ROLES = ["THE_TRAGEDY_OF_KING_LEAR_KENT", "THE_TRAGEDY_OF_KING_LEAR_FOOL", "HAMLET_HAMLET", "HAMLET_OPHELIA"]


def write_shakespeare(root, roles=ROLES, train_per: int = 12, test_per: int = 4, seed: int = 0) -> dict:
    """LEAF's layout shakespeare/data/{train,test}/*.json (roles over two train files); returns
    {(split, role): (x strings, y chars)} as written. Text drawn from LEAF's alphabet plus '~' and 'é'
    (outside it: read as the space)."""
    rng = np.random.RandomState(seed)
    alphabet = LETTERS + "~é"
    written = {}
    for split, per in (("train", train_per), ("test", test_per)):
        folder = os.path.join(root, "shakespeare", "data", split)
        os.makedirs(folder, exist_ok=True)
        chunks = [roles[: len(roles) // 2], roles[len(roles) // 2:]] if split == "train" else [roles]
        for i, chunk in enumerate(chunks):
            blob = {"users": list(chunk), "num_samples": [per] * len(chunk), "hierarchies": [], "user_data": {}}
            for role in chunk:
                text = "".join(rng.choice(list(alphabet), per + 80))
                xs, ys = [text[j:j + 80] for j in range(per)], [text[j + 80] for j in range(per)]
                blob["user_data"][role] = {"x": xs, "y": ys}
                written[split, role] = (xs, ys)
            with open(os.path.join(folder, f"all_data_niid_0_keep_0_{split}_{i}.json"), "w") as f:
                json.dump(blob, f)
    return written


WORDS = {1: "war minister election troops", 2: "match goal season coach", 3: "stocks profit shares oil",
         4: "software internet space nasa"}


def write_agnews(root, train_per: int = 30, test_per: int = 8, seed: int = 0) -> None:
    """ag_news_csv/{train,test}.csv as the release writes them: quoted "class","title","description",
    its escapes (`#39;`, `\\`) in; each class's words its own, test rows carry a word no training row has."""
    rng = np.random.RandomState(seed)
    folder = os.path.join(root, "ag_news_csv")
    os.makedirs(folder, exist_ok=True)
    for split, per in (("train", train_per), ("test", test_per)):
        rows = []
        for c in range(1, 5):
            for _ in range(per):
                words = rng.choice(WORDS[c].split() + ["the", "a", "of"], rng.randint(3, 12)).tolist()
                extra = ["zyzzyva"] if split == "test" else []
                own = rng.choice(WORDS[c].split())  # every row holds one word of its class
                rows.append([str(c), f"{own.title()} it#39;s {words[0]}", " ".join(words[1:] + extra) + " \\ (AP)"])
        order = rng.permutation(len(rows))
        with open(os.path.join(folder, f"{split}.csv"), "w", newline="") as f:
            csv.writer(f, quoting=csv.QUOTE_ALL).writerows([rows[i] for i in order])
    with open(os.path.join(folder, "classes.txt"), "w") as f:
        f.write("World\nSports\nBusiness\nSci/Tech\n")


WNIDS = ["n01641577", "n01443537", "n01629819"]  # not sorted: labels follow wnids.txt's order


def write_tinyimagenet(root, wnids=WNIDS, train_per: int = 6, val_per: int = 3) -> None:
    """tiny-imagenet-200's layout with JPEGs of one flat colour per class (class i: red 40 + 80 i),
    val images listed in val_annotations.txt in a shuffled order, one grey image among them."""
    from PIL import Image

    base = os.path.join(root, "tiny-imagenet-200")
    os.makedirs(os.path.join(base, "val", "images"), exist_ok=True)
    with open(os.path.join(base, "wnids.txt"), "w") as f:
        f.write("".join(w + "\n" for w in wnids))
    colour = lambda i: (40 + 80 * i, 100, 200)
    for i, w in enumerate(wnids):
        d = os.path.join(base, "train", w, "images")
        os.makedirs(d, exist_ok=True)
        for j in range(train_per):
            Image.new("RGB", (64, 64), colour(i)).save(os.path.join(d, f"{w}_{j}.JPEG"))
        with open(os.path.join(base, "train", w, f"{w}_boxes.txt"), "w") as f:
            f.write("")
    lines = []
    for k, (i, w) in enumerate([(i, w) for j in range(val_per) for i, w in enumerate(wnids)]):
        name = f"val_{k}.JPEG"
        img = Image.new("L", (64, 64), 120) if k == 0 else Image.new("RGB", (64, 64), colour(i))
        img.save(os.path.join(base, "val", "images", name))
        lines.append(f"{name}\t{w}\t0\t0\t63\t63\n")
    with open(os.path.join(base, "val", "val_annotations.txt"), "w") as f:
        f.writelines(reversed(lines))


def write_cifar100_both(root, per_class: int = 2, test_per_class: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """cifar-100-python/{train,test} as the release pickles them (fine_labels and coarse_labels, the
    superclass of fine label f here f // 5); returns the fine labels of train and test."""
    folder = os.path.join(root, "cifar-100-python")
    os.makedirs(folder, exist_ok=True)
    rng = np.random.RandomState(100)
    out = []
    for split, per in (("train", per_class), ("test", test_per_class)):
        fine = rng.permutation(np.repeat(np.arange(100), per))
        x = rng.randint(0, 256, (len(fine), 3072)).astype(np.uint8)
        with open(os.path.join(folder, split), "wb") as f:
            pickle.dump({b"data": x, b"fine_labels": fine.tolist(), b"coarse_labels": (fine // 5).tolist()}, f)
        out.append(fine)
    return tuple(out)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = str(tmp_path_factory.mktemp("more"))
    write_shakespeare(r)
    write_agnews(r)
    write_tinyimagenet(r)
    write_cifar100_both(r)
    return r


# ----------------------------------------------------------------------------------------------
# the loaders
# ----------------------------------------------------------------------------------------------

def test_shakespeare_rows_are_leafs_character_ids_one_client_per_role(root, tmp_path):
    from fedrun.data.datasets.shakespeare import char_ids

    # LEAF's ids (positions in its ALL_LETTERS, read off LEAF's / PFLlib's language_utils.py): 'A' 25,
    # 'b' 54, ' ' 1, 'c' 55, '}' 79, newline 0; '~' is not in it and reads as the space
    assert char_ids("Ab c}\n~").tolist() == [25, 54, 1, 55, 79, 0, 1] and len(LETTERS) == 80
    written = write_shakespeare(str(tmp_path))
    d = composed(dict(name="shakespeare", root=str(tmp_path)), dict(name="natural"))
    assert d.num_clients == 4 and d.num_classes == 80 and d.feature_shape == (80,)
    assert d.train.sizes.tolist() == [12] * 4 and d.test.sizes.tolist() == [4] * 4
    decode = lambda ids: "".join(LETTERS[i] for i in ids)
    known = lambda s: "".join(c if c in LETTERS else " " for c in s)
    # the natural partition orders clients by role name; every row is its role's text, in order
    for c, role in enumerate(sorted(ROLES)):
        for split, part in (("train", d.train), ("test", d.test)):
            xs, ys = written[split, role]
            rows = part.x[part.offsets[c]: part.offsets[c] + part.sizes[c]]
            assert [decode(r) for r in rows.tolist()] == [known(x) for x in xs]
            assert decode(part.y[part.offsets[c]: part.offsets[c] + part.sizes[c]].tolist()) == known("".join(ys))
    assert any(set("~é") & set("".join(xs)) for xs, _ in written.values())  # the unknown characters were there to map
    pooled = composed(dict(name="shakespeare", root=str(tmp_path)), dict(name="dirichlet", num_clients=3, min_size=1))
    assert int(pooled.train.sizes.sum() + pooled.test.sizes.sum()) == 64


def test_agnews_vocabulary_comes_from_the_training_rows_only(root):
    from collections import Counter

    from fedrun.data.datasets.agnews import AgNews, read_agnews_csv

    assert tokens("Foo it#39;s BAR, baz \\ (AP) &amp;") == ["foo", "it's", "bar", ",", "baz", "(", "ap", ")", "&"]
    texts, labels = read_agnews_csv(os.path.join(root, "ag_news_csv", "train.csv"))
    test_texts, _ = read_agnews_csv(os.path.join(root, "ag_news_csv", "test.csv"))
    assert sorted(set(labels.tolist())) == [0, 1, 2, 3]  # the file's classes 1-4
    assert all(set(tokens(t)) & set(WORDS[int(y) + 1].split()) for t, y in zip(texts, labels))
    counts = Counter(t for text in texts for t in tokens(text))
    for vocab_size, max_len in ((1000, 40), (12, 6)):
        rows = AgNews(root=root, vocab_size=vocab_size, max_len=max_len).load()
        assert rows.vocab_size == min(vocab_size, len(counts) + 2)  # ids used: padding, unknown, the tokens kept
        # ids 2.. go to the training rows' tokens, most frequent first; "zyzzyva" (test rows only) is UNK
        kept = sorted(counts, key=lambda t: (-counts[t], t))[: vocab_size - 2]
        vocab = {t: i + 2 for i, t in enumerate(kept)}
        expect = lambda text: ([vocab.get(t, UNK) for t in tokens(text)] + [PAD] * max_len)[:max_len]
        assert rows.train_x.tolist() == [expect(t) for t in texts] and rows.train_y.tolist() == labels.tolist()
        assert rows.test_x.tolist() == [expect(t) for t in test_texts] and rows.num_classes == 4
    assert len(counts) < 998 and "zyzzyva" not in counts and all(UNK in r for r in AgNews(root=root).load().test_x)
    d = composed(dict(name="agnews", root=root, vocab_size=12, max_len=6), dict(name="iid", num_clients=2))
    assert d.num_classes == 4 and d.feature_shape == (6,) and not d.train.x.dtype.is_floating_point
    assert int(d.train.sizes.sum() + d.test.sizes.sum()) == 152 and d.vocab_size == 12
    capped = composed(dict(name="agnews", root=root, vocab_size=1000, max_len=6), dict(name="iid", num_clients=2))
    assert capped.vocab_size == len(counts) + 2 == int(capped.train.x.max()) + 1


def test_agnews_max_len_past_memory_is_one_line_before_reading(tmp_path):
    """dataset.max_len=50000000 ended in a wrapped MemoryError after reading the files."""
    from fedrun.data.datasets.agnews import RELEASE_ROWS, TOKEN_BYTES, AgNews
    from fedrun.device import physical_memory

    allowed = physical_memory() // 4 // (RELEASE_ROWS * TOKEN_BYTES)
    with pytest.raises(ValueError) as e:
        AgNews(root=str(tmp_path / "none"), download=False, max_len=allowed + 1)
    assert str(e.value).startswith(f"dataset.max_len={allowed + 1}: the release's 127,600 rows of max_len token ids ")
    assert f"allowed: 1..{allowed} " in str(e.value) and "\n" not in str(e.value)
    AgNews(root=str(tmp_path / "none"), download=False, max_len=allowed)


def test_tinyimagenet_layout_labels_by_wnids_and_val_annotations(root):
    d = composed(dict(name="tinyimagenet", root=root), dict(name="iid", num_clients=1, test="dataset"))
    assert d.num_classes == 200 and d.feature_shape == (3, 64, 64) and d.augment == "crop_flip"
    assert int(d.train.sizes.sum()) == 18 and int(d.test.sizes.sum()) == 9
    # one flat colour per class: the red channel orders the classes; the grey val image is read as RGB
    for split in (d.train, d.test):
        red = split.x[:, 0].mean((1, 2))
        for c in range(3):
            rows = split.y == c
            assert rows.any() and float(red[rows].std() if rows.sum() > 1 else 0) < (1.0 if split is d.train else 10.0)
        means = [float(red[split.y == c].median()) for c in range(3)]
        assert means == sorted(means)
    assert abs(float(d.train.x.mean())) < 1e-4


def test_cifar100_coarse_labels_are_the_pickles_superclasses(root):
    fine = composed(dict(name="cifar100", root=root), dict(name="iid", num_clients=1, test="dataset"))
    coarse = composed(dict(name="cifar100", root=root, labels="coarse"),
                      dict(name="iid", num_clients=1, test="dataset"))
    assert fine.num_classes == 100 and coarse.num_classes == 20
    assert (coarse.train.y == fine.train.y // 5).all() and (coarse.test.y == fine.test.y // 5).all()
    with pytest.raises(ValueError, match="dataset.labels='coarse': allowed one of fine"):
        composed(dict(name="cifar10", root=root, labels="coarse"), dict(name="iid"))


# ----------------------------------------------------------------------------------------------
# every partition, the missing files, a file that is not the format
# ----------------------------------------------------------------------------------------------

CASES = {"iid": dict(num_clients=3), "dirichlet": dict(num_clients=3, alpha=1.0, min_size=1),
         "shards": dict(num_clients=3, shards_per_client=2), "classes": dict(num_clients=3, classes_per_client=2),
         "quantity": dict(num_clients=3, min_size=2), "mixture": dict(num_clients=3, min_size=1),
         "acid": dict(num_clients=3, classes_per_client=2), "natural": {},
         "perfedavg_split": dict(num_clients=2, a=2), "pfedme_labels": dict(num_clients=2)}
MNIST_RULES = ("perfedavg_split", "pfedme_labels")  # Per-FedAvg's and pFedMe's MNIST rules: 10 classes only
# acid's 50+ rows per device: not in tiny files
TOO_FEW = {("shakespeare", "acid"), ("agnews", "acid"), ("cifar100", "acid")}


def test_every_partition_composes_with_every_new_dataset_or_says_why_not(root):
    assert set(CASES) == set(group_options("partition")) - {"_split"}
    for dataset in ("shakespeare", "agnews", "tinyimagenet", "cifar100"):
        for name, opts in CASES.items():
            try:
                d = composed(dict(name=dataset, root=root), dict(name=name, **opts))
            except ValueError as e:
                says = ("needs rows with writer ids" if name == "natural" else "needs a dataset of 10 classes"
                        if name in MNIST_RULES else "but its devices need at least")
                assert says in str(e) and "\n" not in str(e), (dataset, name, str(e))
                assert name in MNIST_RULES or (name == "natural") != ((dataset, name) in TOO_FEW), (dataset, name)
                continue
            assert name not in MNIST_RULES and (dataset, name) not in TOO_FEW
            assert d.num_clients == (4 if name == "natural" else opts["num_clients"])
            assert int(d.train.y.max()) < d.num_classes and int(d.test.y.max()) < d.num_classes


@pytest.mark.parametrize("dataset, says", [
    ("shakespeare",
     "LEAF's JSON user files (*.json) in {root}/shakespeare/data/train and {root}/shakespeare/data/test"),
    ("agnews", "AG News not found: expected train.csv, test.csv in {root}/ag_news_csv (download=false)"),
    ("tinyimagenet", "Tiny-ImageNet not found: expected wnids.txt, train, val/val_annotations.txt, val/images in "
                     "{root}/tiny-imagenet-200 (download=false)"),
])
def test_missing_files_are_one_line_naming_the_files_and_folder(tmp_path, dataset, says):
    with pytest.raises(DataMissingError) as e:
        composed(dict(name=dataset, root=str(tmp_path), download=False), dict(name="iid", num_clients=2))
    assert says.format(root=tmp_path) in str(e.value) and "\n" not in str(e.value)


def test_a_file_that_is_not_the_format_is_one_line_naming_it(tmp_path):
    write_shakespeare(str(tmp_path))
    path = tmp_path / "shakespeare" / "data" / "test" / "all_data_niid_0_keep_0_test_0.json"
    blob = json.loads(path.read_text())
    blob["user_data"][ROLES[0]]["x"][1] = "too short"
    path.write_text(json.dumps(blob))
    with pytest.raises(DataCorruptError, match=rf"{path} is not shakespeare rows: user '{ROLES[0]}' has an x that is "
                                                r"not a string of 80 characters \('too short'\)"):
        composed(dict(name="shakespeare", root=str(tmp_path)), dict(name="natural"))
    write_agnews(str(tmp_path))
    with open(tmp_path / "ag_news_csv" / "train.csv", "a") as f:
        f.write('"5","a fifth class","no such class"\n')
    with pytest.raises(DataCorruptError, match=r"train.csv is not an ag_news_csv file: line 121 is not \"class 1-4\""):
        composed(dict(name="agnews", root=str(tmp_path)), dict(name="iid", num_clients=2))


def test_fedrun_runs_agnews_textcnn_with_the_datasets_vocabulary_and_shakespeare_lstm(root, tmp_path):
    """The commands a user types: the text model's embedding has dataset.vocab_size rows (no model option),
    capped at the training rows' distinct tokens + 2 (the tiny files' 23: 25, not 37; 30,000 rows of a
    corpus of a few thousand tokens made 2 rounds of TextCNN take 1,039 s), said in one line."""
    import glob

    import torch

    small = ["algo=fedavg", "algo.alpha=null", "rounds=2", "tau=1", "clients_per_round=2", "batch_size=4",
             "progress=false", "plot=false",
             "checkpoint_every=0", f"dataset.root={root}"]
    runs = {"agnews": ["dataset=agnews", "dataset.vocab_size=37", "dataset.max_len=16", "model=textcnn", "model.dim=8",
                       "model.channels=4", "partition=dirichlet", "partition.num_clients=4", "partition.min_size=5"],
            "shakespeare": ["dataset=shakespeare", "model=lstm", "model.hidden=8", "model.embed_dim=4"]}
    for name, args in runs.items():
        r = fedrun([*args, *small, f"hydra.run.dir={tmp_path / name}"], tmp_path)
        assert r.returncode == 0, r.stderr
        assert "fedrun: done in" in r.stdout
        ck = torch.load(glob.glob(str(tmp_path / name / "checkpoints" / "*.pt"))[0], weights_only=True)
        emb = ck["state"]["params"]["embedding.weight"]
        assert tuple(emb.shape) == ((25, 8) if name == "agnews" else (80, 4))
        capped = "fedrun: dataset.vocab_size=37 capped at 25: the training rows hold 23 distinct tokens"
        assert (capped in r.stderr) == (name == "agnews"), r.stderr
    r = fedrun([*runs["agnews"], "model.vocab_size=20", *small], tmp_path)  # the files hold 25 ids (0, 1, 23 tokens)
    assert r.returncode == 2 and ("model.vocab_size=20 is too small for data=composed, whose rows hold ids up to 24"
                                  in r.stderr)
    r = fedrun([*runs["agnews"], "model.vocab_size=40", *small, f"hydra.run.dir={tmp_path / 'own'}"], tmp_path)
    assert r.returncode == 0 and "capped" not in r.stderr, r.stderr  # a vocabulary the user gives the model: kept
    emb = torch.load(glob.glob(str(tmp_path / "own" / "checkpoints" / "*.pt"))[0], weights_only=True)["state"]["params"]
    assert tuple(emb["embedding.weight"].shape) == (40, 8)


def test_a_checkpoint_of_another_embedding_size_is_refused_in_one_line():
    """A run folder written before the cap (embedding [30000, d]) resumed by a model of the corpus's
    vocabulary: refused, not resumed on parameters its model lacks."""
    import torch

    from fedrun.errors import ConfigError
    from fedrun.run.runner import check_checkpoint_shapes

    params = {"embedding.weight": torch.zeros(25, 8), "fc.weight": torch.zeros(4, 8)}
    ck = {"path": "run/checkpoints/round_2.pt", "state": {"params": {**params, "embedding.weight": torch.zeros(37, 8)}}}
    with pytest.raises(ConfigError) as e:
        check_checkpoint_shapes(ck, params)
    assert str(e.value).startswith("the checkpoint run/checkpoints/round_2.pt holds embedding.weight of shape [37, 8], "
                                   "this run's model [25, 8] (a text model's embedding has the vocabulary's rows")
    assert str(e.value).endswith("start over with resume=false or run elsewhere (hydra.run.dir=...)")
    check_checkpoint_shapes({**ck, "state": {"params": params}}, params)
