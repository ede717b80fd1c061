"""The append-only JSONL log of the Lab's runs, which survives crashes. Pure: no torch.

    >>> append_record("runs/lab.jsonl", {"run_id": 0, "tokens_per_s": 1.2e4})
    >>> records, skipped = read_records("runs/lab.jsonl")
    >>> runs = [RunResult.from_dict(r) for r in records]      # core.results; fields a record lacks: None/NaN

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
import warnings
from pathlib import Path

from tunekit.core.breakdown import short
from tunekit.core.conditions import Conditions
from tunekit.core.fmt import fmt_pct
from tunekit.core.notes import Note, is_json_note, to_json
from tunekit.core.results import RECORD_TYPES, TOGGLE_TYPES, RunResult, toggle_fields
from tunekit.core.units import is_missing

SCHEMA = 1


def _clean(v):
    # JSON has no NaN: a figure that could not be measured is written as null
    if isinstance(v, float) and (is_missing(v) or math.isinf(v)):
        return None
    if isinstance(v, Note):  # its kind too: {"kind", "text"}
        return to_json(v)
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if dataclasses.is_dataclass(v) and not isinstance(v, type):  # a trace breakdown, a timeline
        return _clean(dataclasses.asdict(v))
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)  # torch.device, dtypes, paths: their text is what a reader wants


def check_log_path(path) -> Path:
    """A run log's path as given (a str or a path-like naming a file): a folder, an empty name or
    another type is refused before any work, saying what to give instead."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise TypeError(f"log_path must be the path of a JSONL file (str or pathlib.Path), got {path!r}")
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"log_path {str(path)!r} is a folder, not a run log: give a file in it, "
                         f"e.g. log_path={str(path / 'runs.jsonl')!r}")
    return path


def check_writable(path) -> None:
    """Fail now, before any training, if the log cannot be appended to (a missing folder is
    created; a missing log is not: a run that fails or is refused later leaves no empty log behind).
    Raises OSError saying where and why."""
    path = Path(path)
    try:
        if _special(path) in ("a FIFO", "a socket"):  # opening a FIFO waits for a reader: never block on it
            raise OSError(errno.EINVAL, f"it is {_special(path)}, not a file")
        path.parent.mkdir(parents=True, exist_ok=True)
        new = not path.exists()
        with open(path, "ab"):
            pass
        if new:
            path.unlink()
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
    if not (_all_fit(rec, RECORD_TYPES) and _fits(nested, "dict") and _all_fit(nested or {}, TOGGLE_TYPES)
            and _fits(cond, "dict") and _all_fit(cond or {}, CONDITION_TYPES)
            and all(is_json_note(n) for n in rec.get("notes") or [])
            and all(_fits(v, "float") for k in ("losses", "peak_mem_bytes_per_rank") for v in rec.get(k) or [])):
        return False
    try:
        short(rec.get("trace")), short(rec.get("memory"))  # what lab.results() shows of them
    except Exception:
        return False
    return True


CONDITION_TYPES = {f.name: f.type for f in dataclasses.fields(Conditions)}


def toggles_key(t) -> tuple:
    """A setting's toggles as a key: the same for a run's Toggles and the Setting it ran."""
    return tuple((k, getattr(t, k, None)) for k in toggle_fields())


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
        # lab.expect's answers since the last run, by setting: the run of that setting keeps its answer
        self.expectations: dict = {}
        if self.skipped:
            warnings.warn(f"tunekit: {self.skipped} line(s) of {self.path} are not run records (cut short by a "
                          "crash, not JSON, or a field of the wrong type): skipped", stacklevel=3)

    def check_writable(self) -> None:
        check_writable(self.path)

    def expecting(self, setting, step_s: float, peak_bytes: float, base_run: int | None) -> None:
        """Keep lab.expect's answer for ``setting`` (a Toggles or Setting) until the next run: a
        run of that setting records it beside what it measured (``RunResult.expected_step_s``)."""
        self.expectations[toggles_key(setting)] = (step_s, peak_bytes, base_run)

    def add(self, result: RunResult) -> RunResult:
        expected = self.expectations.pop(toggles_key(result.toggles), None)
        self.expectations.clear()   # a new run calibrates the next answers: the older ones are not kept
        if expected is not None and result.status == "ok":
            result.expected_step_s, result.expected_peak_bytes, result.expected_from = expected
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
    from tunekit.core.noise import disagreement
    worst = disagreement([[r.step_s_min for r in rs] for rs in groups])
    verdict = (f"repeat agreement: runs of one setting differ by up to {fmt_pct(worst - 1, 0)} -> "
               + ("the machine was busy; rerun before trusting small differences" if worst > 1.2
                  else "stable enough to compare"))
    return worst, verdict
