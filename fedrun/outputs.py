"""What a run writes: CSVs appended and flushed row by row, JSON and files replaced atomically."""
from __future__ import annotations

import contextlib
import csv
import fcntl
import json
import os
import pickle
import warnings
import zipfile


class CsvLog:
    """Appends one row per call and flushes it, so a killed run keeps every finished row whole."""

    def __init__(self, path: str, columns: list[str]):
        self.path, self.columns = path, columns
        new = not os.path.exists(path) or os.path.getsize(path) == 0
        self._f = open(path, "a", newline="")
        self._w = csv.DictWriter(self._f, fieldnames=columns)
        if new:
            self._w.writeheader()
            self._f.flush()

    def write(self, row: dict) -> None:
        self._w.writerow({k: _fmt(row.get(k)) for k in self.columns})
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def _fmt(v):
    if isinstance(v, float):
        return repr(v)  # the shortest text that reads back as the same float (3e-07 stays 3e-07)
    return "" if v is None else v


def write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_csv(path: str, rows: list[dict], columns: list[str] | None = None) -> None:
    """Whole-table CSV (`columns`: default the first row's keys; a row without one leaves it empty),
    written to a temp file then renamed into place."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns or list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({k: _fmt(v) for k, v in r.items()})
    os.replace(tmp, path)


def write_json(path: str, obj) -> None:
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def cannot_write(e: OSError, fix: str, folder: str | None = None) -> str:
    """One line for an output that could not be written (a read-only or full disk, a file where a
    folder goes): the path (else `folder`), the system's reason and `fix`, e.g. the option that
    names another place."""
    where = e.filename if e.filename is not None else f"into {folder}" if folder else "an output file"
    return f"cannot write {where}: {e.strerror or e} ({fix})"


# ---------------------------------------------------------------------------- the run folder

LOCK_NAME = ".lock"
# why a sweep's job failed, in one line (fedrun.run.runner.keep_failure; fedrun-report shows it)
REASON_FILE = "error.txt"


class FolderBusy(RuntimeError):
    """Another process holds the run folder's lock."""


def lock_folder(folder: str) -> int:
    """Takes `folder`/.lock exclusively (fcntl.flock) and returns its descriptor: one process, one job
    writes a run folder at a time. The kernel releases the lock when the descriptor is closed or the
    process ends in any way (a SIGKILL included), so a stale lock never blocks a rerun.

    Raises FolderBusy, naming the holder's pid, when another job holds it (in this process or another).
    """
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, LOCK_NAME)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise FolderBusy(f"{folder} is in use by another fedrun (pid {holder}); wait for it to end, "
                             f"or give this run its own hydra.run.dir") from None
        try:  # the file locked is still the folder's (a refused job removes its own lock file while holding it)
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def unlock_folder(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)  # closing the descriptor releases the flock


# ---------------------------------------------------------------------------- a run's tables

def write_partition(data, path: str) -> None:
    """partition.csv: per client, its training and test rows and their label counts."""
    k = data.num_classes
    tr, te = data.train.label_counts(k).cpu(), data.test.label_counts(k).cpu()
    rows = []
    for c in range(data.num_clients):
        row = {"client": c, "n_train": int(tr[c].sum()), "n_test": int(te[c].sum())}
        if data.num_holdout:  # unseen clients: never trained, evaluated as new_*
            row["heldout"] = int(c >= data.num_train_clients)
        row.update({f"train_label_{j}": int(tr[c, j]) for j in range(k)})
        row.update({f"test_label_{j}": int(te[c, j]) for j in range(k)})
        rows.append(row)
    write_csv(path, rows)


def write_clients(data, ev, path: str) -> None:
    """clients.csv: per client, its rows and its metrics of the last evaluation `ev`."""
    n_tr, n_te = data.train.sizes.cpu(), data.test.sizes.cpu()
    rows = []
    for c in range(data.num_clients):
        row = {"client": c, "n_train": int(n_tr[c]), "n_test": int(n_te[c])}
        if data.num_holdout:
            row["heldout"] = int(c >= data.num_train_clients)
        row.update({k: float(v[c]) for k, v in ev.per_client.items()})
        rows.append(row)
    write_csv(path, rows)


# ---------------------------------------------------------------------------- checkpoints

CHECKPOINT_VERSION = 1


class CheckpointError(RuntimeError):
    """No usable checkpoint where one was required."""


def checkpoint_paths(folder: str) -> list[str]:
    """Checkpoint files in `folder`, newest round first."""
    if not os.path.isdir(folder):
        return []
    names = [f for f in os.listdir(folder) if f.startswith("round_") and f.endswith(".pt")]
    return [os.path.join(folder, f) for f in sorted(names, reverse=True)]


def save_checkpoint(folder: str, rnd: int, payload: dict, keep: int = 2) -> str:
    """Writes round `rnd`'s checkpoint atomically (temp file, fsync, rename), keeping the newest `keep`."""
    import torch

    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"round_{rnd:07d}.pt")
    tmp = f"{path}.tmp"
    # torch.save given a path writes through its own C++ stream: given a Python file, a Ctrl-C inside
    # it left torch's writer to finish the zip into the file `with` had closed, and the process
    # aborted ("write to closed file", SIGABRT) instead of exiting 130
    try:
        torch.save({"version": CHECKPOINT_VERSION, "round": rnd, **payload}, tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:  # Ctrl-C, a full disk: no half-written temp file left behind
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    os.replace(tmp, path)
    for old in checkpoint_paths(folder)[keep:]:
        os.remove(old)
    return path


def read_checkpoint(path: str) -> dict:
    """The checkpoint in `path`; ValueError (or an I/O error) saying why when it is not a readable
    fedrun checkpoint of this version."""
    import torch

    if not zipfile.is_zipfile(path):  # torch.save writes a zip: anything else (a text file) is refused
        raise ValueError("it is not a file torch.save wrote")  # before torch's own errors (KeyError: 101)
    try:  # tensors and plain containers only: a checkpoint never runs code when it is read
        with warnings.catch_warnings():  # torch's 2-line warnings about the pickle inside: the error says it
            warnings.simplefilter("ignore")
            ck = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "global" in str(e).lower():  # torch names the class or function the pickle would have loaded
            raise ValueError("it holds objects other than tensors and plain containers; refused "
                             "(fedrun reads checkpoints with torch.load(weights_only=True))") from None
        raise ValueError("it is not a file torch.save wrote") from None
    if not isinstance(ck, dict) or ck.get("version") != CHECKPOINT_VERSION or "round" not in ck:
        raise ValueError("not a fedrun checkpoint of this version")
    ck["path"] = path
    return ck


def load_checkpoint(folder: str, warn=print) -> dict | None:
    """The newest readable checkpoint in `folder` (None if there is none).

    A corrupt or truncated file is reported through `warn` in one line and the previous one is
    tried; if every file is unreadable, raises CheckpointError.
    """
    paths = checkpoint_paths(folder)
    for path in paths:
        try:
            return read_checkpoint(path)
        except Exception as e:  # noqa: BLE001 - any unreadable file falls back to the previous one
            warn(f"fedrun: warning: checkpoint {path} is unreadable ({type(e).__name__}: {str(e)[:200]}); trying the "
                 "previous one")
    if paths:
        raise CheckpointError(f"no readable checkpoint in {folder} (tried {len(paths)}); run with resume=false to "
                              "start over")
    return None
