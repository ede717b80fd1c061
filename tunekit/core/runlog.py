"""The Lab's run records and their append-only JSONL log, which survives crashes. Pure: no torch.

    >>> append_record("runs/lab.jsonl", {"run_id": 0, "tokens_per_s": 1.2e4})
    >>> records, skipped = read_records("runs/lab.jsonl")
    >>> runs = [RunResult.from_dict(r) for r in records]      # fields a record lacks: None/NaN

Each record is one line written with a single ``write`` and then ``fsync``ed, so a finished run is
on disk before ``lab.run`` returns. A crash mid-write can leave at most one partial last line;
readers skip it (and count it), and the next append starts on a fresh line so nothing is glued
to the garbage.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import stat
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from .breakdown import short
from .conditions import Conditions
from .summary import mark_rates
from .toggles import Toggles
from .units import MiB

SCHEMA = 1


def _clean(v):
    # JSON has no NaN: a figure that could not be measured is written as null
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if dataclasses.is_dataclass(v) and not isinstance(v, type):  # a trace breakdown, a timeline
        return _clean(dataclasses.asdict(v))
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)  # torch.device, dtypes, paths: their text is what a reader wants


def check_writable(path) -> None:
    """Fail now, before any training, if the log cannot be appended to (a missing folder is
    created). Raises OSError saying where and why."""
    path = Path(path)
    try:
        if _special(path) in ("a FIFO", "a socket"):  # opening a FIFO waits for a reader: never block on it
            raise OSError(errno.EINVAL, f"it is {_special(path)}, not a file")
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab"):
            pass
    except OSError as e:
        raise OSError(e.errno, f"the run log {path} cannot be written ({e.strerror or e}); "
                      "give the Lab a writable log_path=") from e


def append_record(path, record, session: str | None = None) -> dict:
    """Append one record as a line and force it to disk; returns what was written.

    ``record`` is a dict, or a function ``next_run_id -> dict``: it is called under an exclusive
    lock on the log with one more than the largest run_id already in it (among the records of
    ``session`` when given: each Lab numbers its own runs in a shared log), so processes sharing
    a log never write the same id."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab+") as f:
        _lock(f)
        try:
            text = b""
            if os.path.isfile(path):  # a device (/dev/full, a pipe) has no lines to read
                f.seek(0)
                text = f.read()
            if callable(record):
                record = record(1 + max((r.get("run_id", -1) for r in _parse(text)[0]
                                         if isinstance(r.get("run_id"), int)
                                         and (session is None or r.get("session") == session)), default=-1))
            line = (json.dumps(_clean({"schema": SCHEMA, **record}), sort_keys=False) + "\n").encode()
            if text and not text.endswith(b"\n"):  # an earlier crash left half a line: end it
                line = b"\n" + line
            if text:
                f.seek(0, os.SEEK_END)
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        finally:
            _lock(f, release=True)
    return record


def _lock(f, release: bool = False) -> None:
    try:
        import fcntl
    except ImportError:  # not POSIX: no cross-process lock, ids stay unique per process
        return
    fcntl.flock(f.fileno(), fcntl.LOCK_UN if release else fcntl.LOCK_EX)


def _special(path: Path) -> str | None:
    """"a directory", "a FIFO" or "a socket": no lines to read (a FIFO blocks its reader), else None."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    return next((what for what, test in (("a directory", stat.S_ISDIR), ("a FIFO", stat.S_ISFIFO),
                                         ("a socket", stat.S_ISSOCK)) if test(mode)), None)


def read_records(path) -> tuple[list[dict], int]:
    """(records in order, number of lines skipped: cut short, not JSON, or not a run record).
    A missing file, or a device such as /dev/full, is ([], 0); a directory, FIFO or unreadable
    file is ([], 0) with one warning."""
    path = Path(path)
    if _special(path):
        warnings.warn(f"tunekit: {path} is {_special(path)}, not a run log: no runs read from it", stacklevel=2)
        return [], 0
    if not path.is_file():  # missing, or a device such as /dev/full that reads forever
        return [], 0
    try:
        text = path.read_bytes()
    except OSError as e:
        warnings.warn(f"tunekit: the run log {path} cannot be read ({e}): no runs read from it", stacklevel=2)
        return [], 0
    return _parse(text)


def _parse(text: bytes) -> tuple[list[dict], int]:
    records, skipped = [], 0
    for raw in text.split(b"\n"):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except ValueError:  # cut short by a crash, not JSON, not UTF-8
            skipped += 1
            continue
        if _is_record(rec):
            records.append(rec)
        else:
            skipped += 1
    return records, skipped


_KINDS = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,), "list": (list,), "dict": (dict,)}


def _fits(v, annotation: str) -> bool:
    """Whether a value read back from JSON has a field's declared type; None always does (a
    figure that was not measured, or a field an older tunekit did not write)."""
    if v is None:
        return True
    kinds = [k.strip() for k in annotation.split("|")]
    if isinstance(v, bool):  # JSON's true is no number
        return "bool" in kinds
    return any(isinstance(v, _KINDS.get(k, ())) for k in kinds)


def _all_fit(d: dict, types: dict) -> bool:
    return all(_fits(d.get(name), kind) for name, kind in types.items())


def _is_record(rec) -> bool:
    """Whether a parsed line is a run record readers can use: written by append_record (it has a
    schema number) with every known field of its declared type, so that no table, figure or later
    run fails on it. Fields it lacks read as None/NaN; fields it has beyond these are ignored."""
    if not isinstance(rec, dict) or type(rec.get("schema")) is not int:
        return False
    nested, cond = rec.get("toggles"), rec.get("conditions")
    if not (_all_fit(rec, _RECORD_TYPES) and _fits(nested, "dict") and _all_fit(nested or {}, _TOGGLE_TYPES)
            and _fits(cond, "dict") and _all_fit(cond or {}, _CONDITION_TYPES)
            and all(isinstance(n, str) for n in rec.get("notes") or [])
            and all(_fits(v, "float") for k in ("losses", "peak_mem_bytes_per_rank") for v in rec.get(k) or [])):
        return False
    try:
        short(rec.get("trace")), short(rec.get("memory"))  # what lab.results() shows of them
    except Exception:
        return False
    return True


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
    status: str = "ok"                    # "ok" | "failed" (then `error` says why; figures NaN)
    error: str | None = None
    guard_s: float | None = None          # seconds the snapshot of weights/optimizer took
    energy_j: float = math.nan            # over the timed steps (NVML/RAPL; NaN: no counter)
    energy_source: str | None = None
    mean_w: float = math.nan
    j_per_token: float = math.nan
    gpu_alloc_retries: int | None = None  # torch.cuda.memory_stats() over the timed steps
    gpu_ooms: int | None = None
    trace: object = None                  # core.breakdown.Breakdown (run(trace=True)); a dict when read back
    memory: object = None                 # core.breakdown.MemoryTimeline (run(memory=True))
    # distributed runs (tunekit.engine.dist); None for a single-process run
    world_size: int | None = None
    parallel: str | None = None           # ddp | fsdp | fsdp_grad_op | hsdp
    nodes: int | None = None
    peak_mem_bytes_per_rank: list | None = None  # peak_mem_bytes is their max
    comm: dict | None = None              # collectives per step: count and bytes by kind/scope
    comm_wait_s: float | None = None      # None where not measurable (see notes)
    launch_s: float | None = None         # launch to the first training step
    losses: list | None = None            # loss of every step, warm-up included
    conditions: object = None             # core.conditions.Conditions over the timed steps (all ranks)
    session: str | None = None            # the Lab that ran it, where Labs share a day's log
    above_peak: str | None = None         # why MFU/HFU are past 100% (core.bounds); None when they are not

    def __getattr__(self, name):  # r.precision, r.micro_batch, ...: the toggles by name
        if name in TOGGLE_FIELDS and "toggles" in self.__dict__:
            return getattr(self.toggles, name)
        raise AttributeError(f"'RunResult' object has no attribute {name!r}")

    def to_dict(self) -> dict:
        """Flat: the toggles as top-level keys, in the order of the DataFrame's columns."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if isinstance(d["conditions"], Conditions):
            d["conditions"] = d["conditions"].to_dict()
        toggles = d.pop("toggles").asdict()
        out = {k: d.pop(k) for k in ("run_id", "label")}
        return {**out, **toggles, **d}

    @classmethod
    def failed(cls, t: Toggles, label: str, reason: str, notes: list, **fields) -> "RunResult":
        """A run that did not finish: its toggles and why; every figure NaN/None."""
        return cls.from_dict({"label": label, **t.asdict(), "status": "failed", "error": reason,
                              "notes": list(notes), "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                              **fields})

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
            elif v is None and f.name == "status":
                v = "ok"
            elif f.name == "conditions":
                v = Conditions.from_dict(v)
            kw[f.name] = v
        return cls(**kw)


TOGGLE_FIELDS = tuple(f.name for f in dataclasses.fields(Toggles))
_TOGGLE_TYPES = {f.name: f.type for f in dataclasses.fields(Toggles)}
_RECORD_TYPES = {**{f.name: f.type for f in dataclasses.fields(RunResult) if f.type not in ("object", "Toggles")},
                 **_TOGGLE_TYPES}   # the log keeps the toggles flattened
_CONDITION_TYPES = {f.name: f.type for f in dataclasses.fields(Conditions)}
_FLOAT_FIELDS = {"tokens_per_s", "step_s", "step_s_min", "step_s_max", "tflops", "mfu", "hfu",
                 "loss", "loss_first", "energy_j", "mean_w", "j_per_token"}


def results_frame(runs: list[RunResult]):
    """pandas DataFrame, one row per run, toggles flattened, notes joined into one string."""
    import pandas as pd

    rows = [{**r.to_dict(), "notes": "; ".join(r.notes), "trace": short(r.trace), "memory": short(r.memory),
             "conditions": None if r.conditions is None else r.conditions.verdict,
             "conditions_reason": None if r.conditions is None else r.conditions.reason}
            for r in runs]
    rest = [f.name for f in dataclasses.fields(RunResult) if f.name not in ("run_id", "label", "toggles")]
    rest.append("conditions_reason")
    return pd.DataFrame(rows, columns=["run_id", "label", *TOGGLE_FIELDS, *rest])


class RunLog:
    """The runs of one Lab: in memory, and appended to a JSONL file as each one finishes.

    Without ``session`` the file's runs are resumed (a log you named is yours); with one, the
    file is shared (the day's log) and this log's runs are those it adds, numbered from 0 and
    tagged with the session. A write that fails (read-only folder, full disk) keeps the run in
    memory and says so in its notes and in a warning; run ids stay unique when several processes
    share one file.
    """

    def __init__(self, path, session: str | None = None):
        self.path, self.session = Path(path), session
        records, self.skipped = read_records(self.path) if session is None else ([], 0)
        self.runs: list[RunResult] = [RunResult.from_dict(r) for r in records]
        if self.skipped:
            warnings.warn(f"tunekit: {self.skipped} line(s) of {self.path} are not run records (cut short by a "
                          "crash, not JSON, or a field of the wrong type): skipped", stacklevel=3)

    def check_writable(self) -> None:
        check_writable(self.path)

    def add(self, result: RunResult) -> RunResult:
        mine = 1 + max((r.run_id for r in self.runs if isinstance(r.run_id, int)), default=-1)

        def numbered(next_in_log):
            result.run_id, result.session = max(mine, next_in_log), self.session or result.session
            return result.to_dict()

        try:
            append_record(self.path, numbered, self.session)
        except OSError as e:
            result.run_id = mine if result.run_id is None else result.run_id
            msg = (f"run #{result.run_id} was NOT saved to {self.path} ({e}); it is in "
                   "lab.results(): lab.save_results('another.jsonl') writes every run")
            result.notes.append(msg)
            warnings.warn(f"tunekit: {msg}", stacklevel=4)
        self.runs.append(result)
        return result

    @staticmethod
    def load(path) -> list:
        """The runs of an existing log; a missing file is an error, skipped lines a warning."""
        if not Path(path).is_file():
            kind = _special(Path(path))
            raise FileNotFoundError(f"no run log at {path}" + (f" (it is {kind})" if kind else ""))
        return RunLog(path).runs

    @staticmethod
    def newest(folder) -> list:
        """The runs of the newest lab-*.jsonl under ``folder``: today's log, after a kernel restart say."""
        logs = sorted((q for q in Path(folder).glob("lab-*.jsonl") if q.is_file()),
                      key=lambda q: (q.stat().st_mtime, q.name))
        if not logs:
            raise FileNotFoundError(f"no lab-*.jsonl under {folder}: no Lab has saved a run there yet")
        return RunLog(logs[-1]).runs

    def save_to(self, path) -> Path:
        path = Path(path)
        check_writable(path)
        for r in self.runs:
            append_record(path, r.to_dict())
        return path



def repeat_agreement(groups) -> tuple[float, str]:
    """How far repeated runs of one setting disagree: (worst best-step ratio, a sentence).

    ``groups``: for each setting, the RunResults of its repeats. Contention only ever adds time,
    so each run's fastest step is compared; a ratio above 1.2 says the machine was busy.

    >>> worst, verdict = repeat_agreement([[r1, r2], [r3, r4]])
    """
    groups = [list(rs) for rs in groups]
    if not groups or not all(groups):
        raise ValueError("repeat_agreement needs, for each setting, a list of its RunResults (at least one "
                         f"setting, each with a run), got {groups!r}"[:300])
    from .noise import disagreement
    worst = disagreement([[r.step_s_min for r in rs] for rs in groups])
    verdict = (f"repeat agreement: runs of one setting differ by up to {worst - 1:.0%} -> "
               + ("the machine was busy; rerun before trusting small differences" if worst > 1.2
                  else "stable enough to compare"))
    return worst, verdict


_VIEW = {"run_id": "#", "label": "run", "tokens_per_s": "tokens/s", "step_ms": "step (ms)",
         "tflops": "TFLOPS", "mfu": "MFU", "hfu": "HFU", "peak_mem_mib": "peak (MiB)",
         "saved_mib": "saved (MiB)", "loss": "loss", "attention_ran": "attn ran",
         "flops_source": "FLOPs", "conditions": "machine", "status": "status"}


def runs_view(df):
    """The columns a person reads first, with units in the headers (dashboard and report)."""
    from .summary import machine_word

    view = df.assign(step_ms=df["step_s"].astype(float) * 1e3, conditions=df["conditions"].map(machine_word),
                     peak_mem_mib=df["peak_mem_bytes"].astype(float) / MiB,
                     saved_mib=df["saved_bytes"].astype(float) / MiB)
    view = mark_rates(view, df["above_peak"])
    return view[list(_VIEW)].rename(columns=_VIEW)

