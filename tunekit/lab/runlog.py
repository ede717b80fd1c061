"""The Lab's run records and their append-only JSONL log, which survives crashes. Pure: no torch.

    >>> append_record("data/runs/lab.jsonl", {"run_id": 0, "tokens_per_s": 1.2e4})
    >>> records, skipped = read_records("data/runs/lab.jsonl")
    >>> runs = [RunResult.from_dict(r) for r in records]      # fields a record lacks: None/NaN

Each record is one line written with a single ``write`` and then ``fsync``ed, so a finished run is
on disk before ``lab.run`` returns. A crash mid-write can leave at most one partial last line;
readers skip it (and count it), and the next append starts on a fresh line so nothing is glued
to the garbage.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from .toggles import Toggles

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


# --- the record of one run -----------------------------------------------------------------


@dataclass
class RunResult:
    """One ``lab.run``: the toggles used and what was measured. Unmeasurable figures are None/NaN.

    The toggles are one ``Toggles`` object (``r.toggles``); each is also readable by name
    (``r.precision``). The log and the DataFrame hold them flattened, one column each.
    """

    run_id: int
    label: str
    toggles: Toggles
    steps: int
    warmup: int
    tokens_per_step: int
    tokens_per_s: float
    step_s: float                     # mean over timed steps
    step_s_min: float
    step_s_max: float
    flops_per_step: float | None      # executed (counted, recompute included): HFU, TFLOPS
    model_flops_per_step: float | None  # analytic for the demo GPT: MFU
    flops_source: str                 # counted | cached | none
    tflops: float
    mfu: float
    hfu: float
    peak_tflops: float | None
    peak_tflops_source: str
    peak_mem_bytes: float | None
    peak_source: str
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    saved_bytes: int | None           # activations saved for backward by one micro-batch
    loss: float                       # last timed step
    loss_first: float                 # first step of the run (warm-up included)
    device: str
    attention_ran: str | None
    compute_dtype: str
    autocast_dtype: str | None
    model: str
    n_params: int
    time: str = ""
    notes: list = field(default_factory=list)
    weight_cast_bytes: int | None = None  # autocast's half weight copies kept for backward
    mfu_convention: str | None = None     # how model_flops_per_step was obtained (core.formulas)

    def __getattr__(self, name):  # r.precision, r.micro_batch, ...: the toggles by name
        if name in TOGGLE_FIELDS and "toggles" in self.__dict__:
            return getattr(self.toggles, name)
        raise AttributeError(f"'RunResult' object has no attribute {name!r}")

    def to_dict(self) -> dict:
        """Flat: the toggles as top-level keys, in the order of the DataFrame's columns."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        toggles = d.pop("toggles").asdict()
        out = {k: d.pop(k) for k in ("run_id", "label")}
        return {**out, **toggles, **d}

    @classmethod
    def from_dict(cls, d: dict) -> "RunResult":
        """From a log record; a field it lacks (an older or newer tunekit wrote it) is None/NaN."""
        nested = d.get("toggles") if isinstance(d.get("toggles"), dict) else {}
        known = {k: v for k, v in {**d, **nested}.items() if k in TOGGLE_FIELDS and v is not None}
        kw = {"toggles": Toggles().replace(**known)}
        for f in dataclasses.fields(cls):
            if f.name == "toggles":
                continue
            v = d.get(f.name)
            if v is None and f.name in _FLOAT_FIELDS:
                v = math.nan
            elif v is None and f.name == "notes":
                v = []
            kw[f.name] = v
        return cls(**kw)


TOGGLE_FIELDS = tuple(f.name for f in dataclasses.fields(Toggles))
_FLOAT_FIELDS = {"tokens_per_s", "step_s", "step_s_min", "step_s_max", "tflops", "mfu", "hfu",
                 "loss", "loss_first"}


def results_frame(runs: list[RunResult]):
    """pandas DataFrame, one row per run, toggles flattened, notes joined into one string."""
    import pandas as pd

    rows = [{**r.to_dict(), "notes": "; ".join(r.notes)} for r in runs]
    rest = [f.name for f in dataclasses.fields(RunResult) if f.name not in ("run_id", "label", "toggles")]
    return pd.DataFrame(rows, columns=["run_id", "label", *TOGGLE_FIELDS, *rest])
