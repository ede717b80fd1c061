"""Append-only JSONL log of Lab runs that survives crashes. Pure: no torch import.

    >>> append_record("data/runs/lab.jsonl", {"run_id": 0, "tokens_per_s": 1.2e4})
    >>> records, skipped = read_records("data/runs/lab.jsonl")

Each record is one line written with a single ``write`` and then ``fsync``ed, so a finished run is
on disk before ``lab.run`` returns. A crash mid-write can leave at most one partial last line;
readers skip it (and count it), and the next append starts on a fresh line so nothing is glued
to the garbage.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

SCHEMA = 1


def _clean(v):
    # JSON has no NaN: a figure that could not be measured is written as null
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)  # torch.device, dtypes, paths: their text is what a reader wants


def append_record(path, record: dict) -> None:
    """Append one record as a line and force it to disk."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(_clean({"schema": SCHEMA, **record}), sort_keys=False) + "\n").encode()
    with open(path, "ab+") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":  # an earlier crash left half a line: end it first
                line = b"\n" + line
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def read_records(path) -> tuple[list[dict], int]:
    """(records in order, number of unreadable lines skipped). A missing file is ([], 0)."""
    path = Path(path)
    if not path.exists():
        return [], 0
    records, skipped = [], 0
    for raw in path.read_bytes().split(b"\n"):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except ValueError:
            skipped += 1
            continue
        if isinstance(rec, dict):
            records.append(rec)
        else:
            skipped += 1
    return records, skipped
