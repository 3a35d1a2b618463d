"""Each reader against literal expected rows (issue 45.2), and the files a reader must refuse in one
line naming the file (issue 46.3).

The files are written by hand, in the release's own format, holding the release's quirks: AG News's
escapes (`#39;`, `&amp;`, `\\n`, a lone `\\`, `""`), Shakespeare's characters outside LEAF's alphabet
and LEAF's JSON layout, Tiny-ImageNet's wnids.txt order and val_annotations.txt lines, CIFAR-100's two
label sets (and the cache key that tells them apart), EMNIST's transposed images and 1-based letters.
The expected token ids, character ids, labels and pixels are written out below, worked by hand from
the files, never computed with the reader's own functions."""
from __future__ import annotations

import gzip
import json
import os
import pickle

import numpy as np
import pytest
import torch
from helpers import compose_data as composed

from fedrun.errors import DataCorruptError

R2 = float(np.sqrt(2.0))  # the normalized pixels of the Tiny-ImageNet files below: +-1/sqrt(2), +-sqrt(2)


def one_line_naming(e, path) -> str:
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg, msg
    return msg


# ----------------------------------------------------------------------------------------------
# AG News: the CSV's escapes
# ----------------------------------------------------------------------------------------------

AG_TRAIN = r'''"3","Oil#39;s ""Rise""","oil\nprices \ up &amp; down"
"1","War, &lt;b&gt;war","it#39;s 5 #36;"
"2","Goal","goal\goal"
'''
AG_TEST = r'''"4","Nasa#39;s &quot;Goal&quot;","war\nwar"
'''


def test_agnews_escapes_read_as_the_release_means_them(tmp_path):
    """Tokens by hand: row 1 is `oil's " rise " oil prices up & down` (`#39;` the apostrophe, `""` a
    quote, `\\n` and a lone backslash spaces, `&amp;` &); row 2 `war , < b > war it's 5 $`; row 3
    `goal goal goal`. Counts: goal 3, `"` 2, war 2, the rest 1; ids from 2 by count then text:
    goal 2, `"` 3, war 4, $ 5, & 6, `,` 7, 5 8, < 9, > 10, b 11 (vocab_size 12 keeps these ten),
    the rest UNK 1, padding 0."""
    from fedrun.data.datasets.agnews import AgNews

    folder = tmp_path / "ag_news_csv"
    folder.mkdir()
    (folder / "train.csv").write_text(AG_TRAIN, encoding="utf-8")
    (folder / "test.csv").write_text(AG_TEST, encoding="utf-8")
    rows = AgNews(root=str(tmp_path), vocab_size=12, max_len=8, download=False).load()
    assert rows.train_x.tolist() == [[1, 3, 1, 3, 1, 1, 1, 6],
                                     [4, 7, 9, 11, 10, 4, 1, 8],
                                     [2, 2, 2, 0, 0, 0, 0, 0]]
    assert rows.train_y.tolist() == [2, 0, 1]
    # `Nasa's "Goal" war war`: nasa's (test rows only) is UNK, &quot; a quote
    assert rows.test_x.tolist() == [[1, 3, 2, 3, 4, 4, 0, 0]] and rows.test_y.tolist() == [3]


# ----------------------------------------------------------------------------------------------
# Shakespeare: LEAF's layout, characters outside its alphabet
# ----------------------------------------------------------------------------------------------

# LEAF's ids: newline 0, space 1, '?' 24, 'A'..'Z' 25..50, 'a'..'z' 53..78, '}' 79 (positions in
# LEAF's ALL_LETTERS, read off language_utils.py); every other character reads as the space (1).
HEAD = "Où’s\tKENT}\n~😀"  # ù (latin-1), ’ (U+2019), tab, ~ and an emoji (outside the BMP) are not LEAF's
HEAD_IDS = [39, 1, 1, 71, 1, 35, 29, 38, 44, 79, 0, 1, 1]


def write_leaf_json(path, blob) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(blob), encoding="utf-8")  # ensure_ascii: the emoji a surrogate pair, as LEAF writes it


def test_shakespeare_rows_are_literal_ids_in_leafs_layout(tmp_path):
    from fedrun.data.datasets.shakespeare import Shakespeare

    x0 = HEAD + "a" * (80 - len(HEAD))  # 80 characters, the emoji one of them
    x1 = "b" * 79 + "É"
    base = tmp_path / "shakespeare" / "data"
    # two train files (read in name order), users in the file's order, not sorted; "hierarchies" as LEAF writes it
    write_leaf_json(base / "train" / "all_data_0.json", {
        "users": ["KING_LEAR_KENT", "HAMLET_HAMLET"], "num_samples": [2, 1], "hierarchies": [],
        "user_data": {"HAMLET_HAMLET": {"x": [x1], "y": ["?"]}, "KING_LEAR_KENT": {"x": [x0, x1], "y": ["é", "}"]}}})
    write_leaf_json(base / "train" / "all_data_1.json", {
        "users": ["A_ROLE"], "num_samples": [1], "user_data": {"A_ROLE": {"x": [x0], "y": ["\n"]}}})
    write_leaf_json(base / "test" / "all_data_0.json", {
        "users": ["HAMLET_HAMLET"], "num_samples": [1], "user_data": {"HAMLET_HAMLET": {"x": [x0], "y": ["A"]}}})
    rows = Shakespeare(root=str(tmp_path)).load()
    r0, r1 = HEAD_IDS + [53] * 67, [54] * 79 + [1]
    assert rows.train_x.tolist() == [r0, r1, r1, r0]
    assert rows.train_y.tolist() == [1, 79, 24, 0]
    assert rows.groups[0].tolist() == ["KING_LEAR_KENT", "KING_LEAR_KENT", "HAMLET_HAMLET", "A_ROLE"]
    assert rows.test_x.tolist() == [r0] and rows.test_y.tolist() == [25]
    assert rows.groups[1].tolist() == ["HAMLET_HAMLET"]
    assert rows.num_classes == 80


def femnist_blob(users: dict) -> dict:
    return {"users": list(users), "num_samples": [len(u["y"]) for u in users.values()], "user_data": users}


def test_femnist_rows_are_literal_pixels_normalized_by_the_training_rows(tmp_path):
    """Training pixels 0 and 1 in equal numbers: mean 0.5, std 0.5, so 0 -> -1, 1 -> 1, and the test
    row's 0.75 -> 0.5 (the test rows never shape the statistics)."""
    from fedrun.data.datasets.leaf import Leaf

    base = tmp_path / "femnist" / "data"
    two = {"f0001_3": {"x": [[0.0] * 784, [1.0] * 784], "y": [61, 0]}}
    write_leaf_json(base / "train" / "a.json", femnist_blob(two))
    write_leaf_json(base / "test" / "a.json", femnist_blob({"f0001_3": {"x": [[0.75] * 784], "y": [7]}}))
    rows = Leaf(root=str(tmp_path)).load()
    assert rows.train_x.tolist() == [[-1.0] * 784, [1.0] * 784] and rows.train_y.tolist() == [61, 0]
    assert rows.test_x.tolist() == [[0.5] * 784] and rows.test_y.tolist() == [7]
    assert rows.groups[0].tolist() == ["f0001_3"] * 2 and rows.num_classes == 62


@pytest.mark.parametrize("x, y, says", [
    ([[float("nan")] * 784], [1], "user 'u''s row 0 holds a pixel that is not a finite number"),
    ([[0.5] * 784, [float("inf")] * 784], [1, 2], "user 'u''s row 1 holds a pixel that is not a finite number"),
    ([[0.5] * 784], [3.7], "user 'u''s y is not integer labels ([3.7])"),
    ([[0.5] * 784], [True], "user 'u''s y is not integer labels ([True])"),
])
def test_femnist_refuses_nonfinite_pixels_and_fractional_labels_in_one_line(tmp_path, x, y, says):
    from fedrun.data.datasets.leaf import Leaf

    base = tmp_path / "femnist" / "data"
    write_leaf_json(base / "train" / "a.json", femnist_blob({"u": {"x": x, "y": y}}))
    write_leaf_json(base / "test" / "a.json", femnist_blob({"u": {"x": [[0.5] * 784], "y": [1]}}))
    with pytest.raises(DataCorruptError) as e:
        Leaf(root=str(tmp_path)).load()
    assert says in one_line_naming(e, base / "train" / "a.json")


def test_femnist_user_with_no_rows_reads_as_none(tmp_path):
    from fedrun.data.datasets.leaf import Leaf

    base = tmp_path / "femnist" / "data"
    write_leaf_json(base / "train" / "a.json", femnist_blob({"u": {"x": [[0.0] * 784, [1.0] * 784], "y": [1, 2]},
                                                             "v": {"x": [], "y": []}}))
    write_leaf_json(base / "test" / "a.json", femnist_blob({"u": {"x": [[0.5] * 784], "y": [1]}}))
    rows = Leaf(root=str(tmp_path)).load()
    assert rows.train_x.shape == (2, 784) and rows.groups[0].tolist() == ["u", "u"]


# ----------------------------------------------------------------------------------------------
# Tiny-ImageNet: wnids.txt's order, val_annotations.txt's lines, the augmentation's fill
# ----------------------------------------------------------------------------------------------

YELLOW, BLACK, WHITE = (255, 255, 0), (0, 0, 0), (255, 255, 255)  # colours a JPEG keeps exactly


def write_tiny(root, wnids_text: str | bytes, classes: dict, val_lines: str | bytes, val_images: dict) -> str:
    """tiny-imagenet-200 by hand: wnids.txt as given, train/<wnid>/images/<wnid>_<i>.JPEG of the given
    colours, val/val_annotations.txt as given, val/images/<name> of the given colour (or "L": grey 255)."""
    from PIL import Image

    base = os.path.join(root, "tiny-imagenet-200")
    os.makedirs(os.path.join(base, "val", "images"))
    with open(os.path.join(base, "wnids.txt"), "wb") as f:
        f.write(wnids_text if isinstance(wnids_text, bytes) else wnids_text.encode())
    for w, colours in classes.items():
        d = os.path.join(base, "train", w, "images")
        os.makedirs(d)
        for i, c in enumerate(colours):
            Image.new("RGB", (64, 64), c).save(os.path.join(d, f"{w}_{i}.JPEG"))
        open(os.path.join(base, "train", w, f"{w}_boxes.txt"), "w").close()
    for name, c in val_images.items():
        (Image.new("L", (64, 64), 255) if c == "L" else Image.new("RGB", (64, 64), c)).save(
            os.path.join(base, "val", "images", name))
    with open(os.path.join(base, "val", "val_annotations.txt"), "wb") as f:
        f.write(val_lines if isinstance(val_lines, bytes) else val_lines.encode())
    return base


VAL = "val_2.JPEG\tn02\t0\t5\t60\t63\nval_0.JPEG\tn09\t12\t3\t40\t50\nval_1.JPEG\tn05\t1\t1\t62\t62\n"


def write_good_tiny(root) -> str:
    # labels by wnids.txt's line order (n09 0, n02 1, n05 2), not by name
    return write_tiny(root, "n09\nn02\nn05\n", {"n09": [YELLOW], "n02": [BLACK], "n05": [WHITE]}, VAL,
                      {"val_2.JPEG": BLACK, "val_0.JPEG": "L", "val_1.JPEG": YELLOW})


def test_tinyimagenet_rows_labels_and_fill_are_literal(tmp_path):
    """Training pixels per channel: R 255, 0, 255 (mean 170), G the same, B 0, 0, 255 (mean 85); std
    120.208 each (sqrt(14450)): 255 -> 1/sqrt(2) and 0 -> -sqrt(2) in R and G, 0 -> -1/sqrt(2) and
    255 -> sqrt(2) in B. The fill is a black pixel normalized: (-sqrt(2), -sqrt(2), -1/sqrt(2)).
    Val rows in file-name order: val_0 (grey 255 -> white, n09), val_1 (yellow, n05), val_2 (black, n02)."""
    from fedrun.data.augment import apply_augmentation
    from fedrun.data.datasets.tinyimagenet import TinyImageNet

    write_good_tiny(str(tmp_path))
    rows = TinyImageNet(root=str(tmp_path), download=False).load()
    yellow, black, white = [R2 / 2, R2 / 2, -R2 / 2], [-R2, -R2, -R2 / 2], [R2 / 2, R2 / 2, R2]
    eps = 8 * np.finfo(np.float32).eps * R2  # float32 rounding of (x - mean) / std at |values| <= sqrt(2)
    assert rows.train_y.tolist() == [0, 1, 2] and rows.test_y.tolist() == [0, 2, 1] and rows.num_classes == 200
    for got, want in ((rows.train_x, [yellow, black, white]), (rows.test_x, [white, yellow, black])):
        assert got.shape == (3, 3, 64, 64)
        np.testing.assert_allclose(got, np.broadcast_to(np.array(want)[:, :, None, None], got.shape), rtol=0, atol=eps)
    np.testing.assert_allclose(rows.augment_fill, black, rtol=0, atol=eps)

    # the fill reaches the augmentation through the composed data: a crop at offset (0, 0), no flip, of
    # the white image puts 4 rows and 4 columns of the fill above and left of it
    d = composed(dict(name="tinyimagenet", root=str(tmp_path), download=False), dict(name="iid", num_clients=1))
    assert d.augment == "crop_flip"
    x = torch.as_tensor(rows.train_x[2:3])
    params = (torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.bool))
    out = apply_augmentation(d.augment, x, params, d.augment_fill).numpy()[0]
    for c in range(3):
        np.testing.assert_allclose(out[c, :4, :], black[c], rtol=0, atol=eps)
        np.testing.assert_allclose(out[c, :, :4], black[c], rtol=0, atol=eps)
        np.testing.assert_allclose(out[c, 4:, 4:], white[c], rtol=0, atol=eps)


def test_tinyimagenet_refusals_name_the_file_in_one_line(tmp_path):
    from fedrun.data.datasets.tinyimagenet import TinyImageNet

    def refused(name, wnids, classes=None, val=VAL, images=None):
        root = tmp_path / name
        base = write_tiny(str(root), wnids, classes or {"n09": [YELLOW], "n02": [BLACK], "n05": [WHITE]}, val,
                          images or {"val_2.JPEG": BLACK, "val_0.JPEG": "L", "val_1.JPEG": YELLOW})
        with pytest.raises(DataCorruptError) as e:
            TinyImageNet(root=str(root), download=False).load()
        return base, str(e.value)

    # a class listed twice: its images were read twice under the later label, the earlier label had none
    base, msg = refused("twice", "n09\nn02\nn05\nn02\n")
    assert msg.startswith(f"{base}/wnids.txt is not Tiny-ImageNet's wnids.txt: class n02 is listed twice "
                          f"(lines 2 and 4)") and "\n" not in msg
    # 201 classes: labels past the model's 200 outputs (training stopped with an IndexError)
    many = "".join(f"n{i:08d}\n" for i in range(201))
    base, msg = refused("many", many, {f"n{i:08d}": [] for i in range(201)},  # the count is refused before any image
                        "val_0.JPEG\tn00000000\t0\t0\t1\t1\n", {"val_0.JPEG": BLACK})
    assert msg.startswith(f"{base}/wnids.txt is not Tiny-ImageNet's wnids.txt: it lists 201 classes, the release "
                          f"200 (the model's outputs)") and "\n" not in msg
    # not UTF-8: a codec error that named no file
    base, msg = refused("latin1", "n09\nn02\xe9\nn05\n".encode("latin-1"))
    assert msg.startswith(f"{base}/wnids.txt is not a text file of the release (byte 7: b'\\xe9' is not UTF-8)")
    base, msg = refused("val-latin1", "n09\nn02\nn05\n", val=VAL.encode() + "val_\xe9.JPEG\tn02\n".encode("latin-1"))
    assert msg.startswith(f"{base}/val/val_annotations.txt is not a text file of the release")
    # empty: was blamed on val_annotations.txt
    base, msg = refused("empty", "\n")
    assert msg.startswith(f"{base}/wnids.txt is an empty wnids.txt (no class ids)")
    # a class folder it does not list: a torn wnids.txt
    base, msg = refused("torn", "n09\nn02\n")
    assert msg.startswith(f"{base}/wnids.txt is not the wnids.txt of {base}/train: it lists 2 classes, and 1 class "
                          f"folder there is not among them (e.g. n05; a torn copy?)")
    # a line that is a path, not a class id
    base, msg = refused("path", "n09\n../n02\nn05\n")
    assert msg.startswith(f"{base}/wnids.txt is not Tiny-ImageNet's wnids.txt: line 2 is not a class id ('../n02')")
    # an image listed twice in val_annotations.txt would be two test rows
    base, msg = refused("val-twice", "n09\nn02\nn05\n", val=VAL + "val_0.JPEG\tn09\t0\t0\t1\t1\n")
    assert msg.startswith(f"{base}/val/val_annotations.txt is not Tiny-ImageNet's val_annotations.txt: "
                          f"'val_0.JPEG' is listed twice (lines 2 and 4)")
    base, msg = refused("val-path", "n09\nn02\nn05\n", val=VAL + "../../x.JPEG\tn09\t0\t0\t1\t1\n")
    assert "val_annotations.txt: line 4 is not '<file>\\t<wnid of wnids.txt>...'" in msg


def test_tinyimagenet_val_image_listed_but_missing_is_one_line(tmp_path):
    from fedrun.data.datasets.tinyimagenet import TinyImageNet
    from fedrun.errors import DataMissingError

    base = write_good_tiny(str(tmp_path))
    os.remove(os.path.join(base, "val", "images", "val_0.JPEG"))
    with pytest.raises(DataMissingError) as e:
        TinyImageNet(root=str(tmp_path), download=False).load()
    assert one_line_naming(e, base).startswith(f"Tiny-ImageNet incomplete: {base}/val/images/val_0.JPEG, line 2 of "
                                               f"{base}/val/val_annotations.txt, is not there")


def test_tinyimagenet_subset_of_classes_reads_as_labels_from_0(tmp_path):
    """Fewer classes than 200 (a subset, every class folder listed) are labels 0..k-1 of the 200 outputs."""
    from fedrun.data.datasets.tinyimagenet import TinyImageNet

    write_tiny(str(tmp_path), "n05\nn02\n", {"n02": [BLACK], "n05": [WHITE, YELLOW]}, "a.JPEG\tn02\n",
               {"a.JPEG": BLACK})
    rows = TinyImageNet(root=str(tmp_path), download=False).load()
    assert rows.train_y.tolist() == [0, 0, 1] and rows.test_y.tolist() == [1] and rows.num_classes == 200


# ----------------------------------------------------------------------------------------------
# CIFAR: labels in range, CIFAR-100's label choice in the cache key
# ----------------------------------------------------------------------------------------------

def write_cifar_files(root, name: str, train: dict, test: dict) -> str:
    """The release's pickles with the given dicts (a 'data' of one image per label added when absent)."""
    folder, files = {"cifar10": ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]),
                     "cifar100": ("cifar-100-python", ["train", "test"])}[name]
    os.makedirs(os.path.join(root, folder), exist_ok=True)
    for f in files:
        d = dict(test if f.startswith("test") else train)
        labels = next(v for k, v in d.items() if k.endswith(b"labels"))
        d.setdefault(b"data", np.full((len(labels), 3072), 17, dtype=np.uint8))
        with open(os.path.join(root, folder, f), "wb") as fh:
            pickle.dump(d, fh, protocol=2)
    return os.path.join(root, folder)


@pytest.mark.parametrize("name, labels, key, bad, says", [
    ("cifar100", "fine", b"fine_labels", 100, "b'fine_labels' include label 100 at row 1 (1 row outside 0..99)"),
    ("cifar100", "coarse", b"coarse_labels", 20, "b'coarse_labels' include label 20 at row 1 (1 row outside 0..19)"),
    ("cifar100", "coarse", b"coarse_labels", -1, "b'coarse_labels' include label -1 at row 1 (1 row outside 0..19)"),
    ("cifar100", "fine", b"fine_labels", -1, "b'fine_labels' include label -1 at row 1 (1 row outside 0..99)"),
    ("cifar10", "fine", b"labels", 10, "b'labels' include label 10 at row 1 (1 row outside 0..9)"),
    ("cifar10", "fine", b"labels", 2.5, "b'labels' is not 3 integer labels, one per image"),
])
def test_cifar_labels_outside_the_releases_are_one_line_naming_the_file(tmp_path, name, labels, key, bad, says):
    train = {b"fine_labels": [0, 1, 2], b"coarse_labels": [0, 1, 2]} if name == "cifar100" else {b"labels": [0, 1, 2]}
    test = dict(train)
    train[key] = [0, bad, 2]
    folder = write_cifar_files(str(tmp_path), name, train, test)
    with pytest.raises(DataCorruptError) as e:
        composed(dict(name=name, root=str(tmp_path), labels=labels, download=False), dict(name="iid", num_clients=1))
    first = "data_batch_1" if name == "cifar10" else "train"
    assert f"{folder}/{first} is not a CIFAR batch: its {says}" in one_line_naming(e, folder)


def test_cifar100_label_choice_keys_the_cache(tmp_path, monkeypatch):
    """fine and coarse written independently (coarse not fine // 5): a cached fine run is never served
    to a coarse run, nor the other way round, and each reads back from its own cache file (the
    third and fourth runs read no file)."""
    from fedrun.data.datasets.cifar import Cifar

    root, cache = tmp_path / "data", tmp_path / "cache"
    fine, coarse = [0, 99, 57, 5], [4, 19, 3, 11]
    x = np.repeat(np.array([0, 255, 0, 255], dtype=np.uint8)[:, None], 3072, 1)  # per channel mean 127.5, std 127.5
    write_cifar_files(str(root), "cifar100", {b"data": x, b"fine_labels": fine, b"coarse_labels": coarse},
                      {b"data": x[:2], b"fine_labels": [99, 0], b"coarse_labels": [19, 4]})
    part = dict(name="iid", num_clients=1, test="dataset")
    runs = [("fine", 100, fine, [99, 0]), ("coarse", 20, coarse, [19, 4]), ("fine", 100, fine, [99, 0]),
            ("coarse", 20, coarse, [19, 4])]
    for i, (labels, classes, train_y, test_y) in enumerate(runs):
        if i == 2:
            monkeypatch.setattr(Cifar, "load", lambda self: pytest.fail("read the files again, not the cache"))
        d = composed(dict(name="cifar100", root=str(root), labels=labels, download=False), part, cache_dir=str(cache))
        assert d.num_classes == classes, labels
        assert sorted(d.train.y.tolist()) == sorted(train_y) and sorted(d.test.y.tolist()) == sorted(test_y), labels
        assert sorted(d.train.x[:, :, 0, 0].tolist()) == [[-1.0] * 3] * 2 + [[1.0] * 3] * 2
    assert len([f for f in os.listdir(cache) if f.startswith("cifar100_iid-") and f.endswith(".pt")]) == 2


# ----------------------------------------------------------------------------------------------
# MNIST / EMNIST idx files: big-endian header, .gz, EMNIST's transposed images and 1-based letters
# ----------------------------------------------------------------------------------------------

def idx_bytes(arr: np.ndarray) -> bytes:
    return bytes([0, 0, 8, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape) + arr.tobytes()


def test_emnist_letters_idx_rows_are_literal(tmp_path):
    """Stored column-major as torchvision leaves EMNIST: a pixel at stored (row 0, col 1) is upright at
    (row 1, col 0). Letters 1..26 are labels 0..25. Pixel 255 normalizes to (1 - 0.1751) / 0.3332 and
    0 to -0.1751 / 0.3332 (EMNIST's STATS), in float32."""
    from fedrun.data.datasets.idx import Idx

    raw = tmp_path / "EMNIST" / "raw"
    raw.mkdir(parents=True)
    img = np.zeros((2, 28, 28), dtype=np.uint8)
    img[0, 0, 1] = 255  # stored: row 0, col 1
    img[1, 27, 0] = 255  # stored: row 27, col 0
    for part, labels in (("train", [1, 26]), ("test", [13, 1])):
        (raw / f"emnist-letters-{part}-images-idx3-ubyte.gz").write_bytes(gzip.compress(idx_bytes(img)))
        (raw / f"emnist-letters-{part}-labels-idx1-ubyte").write_bytes(idx_bytes(np.array(labels, dtype=np.uint8)))
    rows = Idx(name="emnist", split="letters", root=str(tmp_path), download=False).load()
    assert rows.train_y.tolist() == [0, 25] and rows.test_y.tolist() == [12, 0] and rows.num_classes == 26
    hi, lo = np.float32((1 - 0.1751) / 0.3332), np.float32(-0.1751 / 0.3332)
    want = np.full((2, 784), lo, dtype=np.float32)
    want[0, 1 * 28 + 0] = hi  # upright (row 1, col 0)
    want[1, 0 * 28 + 27] = hi  # upright (row 0, col 27)
    np.testing.assert_allclose(rows.train_x, want, rtol=4 * np.finfo(np.float32).eps, atol=0)
    np.testing.assert_allclose(rows.test_x, want, rtol=4 * np.finfo(np.float32).eps, atol=0)


def test_a_cache_file_with_labels_outside_its_classes_is_rebuilt(tmp_path):
    """A cache file written before the reader refused such labels (CIFAR-100 fine label 100) is not
    served: the rows are read again, from the files (here good ones)."""
    root, cache = tmp_path / "data", tmp_path / "cache"
    write_cifar_files(str(root), "cifar100", {b"fine_labels": [0, 99], b"coarse_labels": [0, 19]},
                      {b"fine_labels": [99, 0], b"coarse_labels": [19, 0]})
    spec = (dict(name="cifar100", root=str(root), download=False), dict(name="iid", num_clients=1, test="dataset"))
    assert sorted(composed(*spec, cache_dir=str(cache)).train.y.tolist()) == [0, 99]
    (path,) = [os.path.join(cache, f) for f in os.listdir(cache) if f.endswith(".pt")]
    blob = torch.load(path, weights_only=True)
    blob["train"]["y"] = torch.tensor([0, 100])  # as the old reader cached a file holding label 100
    torch.save(blob, path)
    assert sorted(composed(*spec, cache_dir=str(cache)).train.y.tolist()) == [0, 99]
