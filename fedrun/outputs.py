"""What a run writes: CSVs appended and flushed row by row, JSON and files replaced atomically."""
from __future__ import annotations

import csv
import json
import os


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
        return f"{v:.6g}" if abs(v) >= 1e4 else f"{v:.6f}"
    return "" if v is None else v


def write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_csv(path: str, rows: list[dict]) -> None:
    """Whole-table CSV, written to a temp file then renamed into place."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({k: _fmt(v) for k, v in r.items()})
    os.replace(tmp, path)


def write_json(path: str, obj) -> None:
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")
