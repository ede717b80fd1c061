"""Where a per-step monitor sends its figures: TensorBoard, MLflow or a JSONL file.

    >>> sinks = open_sinks(["jsonl:runs/a.jsonl", "tensorboard:runs/tb"])   # checked and opened here
    >>> sinks.write(3, {"loss": 2.5, "tokens_per_s": 51200})   # as tunekit/loss, tunekit/tokens_per_s
    >>> sinks.close()                                           # flushes; a second close does nothing

``open_sinks`` checks every target before any training (its form, no target twice, its package,
that it can be written). Then a sink never stops training: one whose write or close raises (a full
disk, a server gone) warns once and is dropped, the others go on. torch, tensorboard, mlflow: lazily.
"""
from __future__ import annotations

import contextlib
import json
import math
import numbers
import tempfile
import time
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

from tunekit.core import validate
from tunekit.core.extras import missing_extra, pip_command

FORMS = "'tensorboard:DIR', 'mlflow:URI' or 'jsonl:PATH'"
PREFIX = "tunekit/"     # every figure's name: tunekit/loss, tunekit/tokens_per_s, ...
EXPERIMENT = "tunekit"  # the MLflow experiment of the runs open_sinks starts
TB_FLUSH_S = 10         # TensorBoard shows a running job's figures within this many seconds


def _folder(entry: str, path: Path) -> Path:
    """``path``, created if missing and shown writable by a file made and removed in it."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"log_to {entry!r}: {path} is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError as e:
        raise OSError(f"log_to {entry!r}: cannot write in the folder {path}: {e}") from e
    return path


def _local_dir(uri: str) -> Path | None:
    """The folder of an MLflow file store (a plain path or a ``file:`` URI); None for a server or database."""
    scheme = urlparse(uri).scheme
    if scheme == "file":
        uri = url2pathname(urlparse(uri).path)
    elif scheme and len(scheme) > 1 or uri == "databricks":   # one letter: a Windows drive
        return None
    return Path(uri).expanduser().resolve()


class _Jsonl:
    """One JSON object a line, ``{"step": 3, "time": <unix s>, "tunekit/loss": 2.5}``, appended and flushed."""

    def __init__(self, entry: str, path: Path, _package):
        self.name = entry
        try:                  # a folder here: IsADirectoryError, said with the path
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")
        except OSError as e:
            raise OSError(f"log_to {entry!r}: cannot write the file {path}: {e}") from e

    def write(self, step: int, figures: dict, now: float) -> None:
        self._file.write(json.dumps({"step": step, "time": now, **figures}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class _TensorBoard:
    """Event files through torch's ``SummaryWriter``: one scalar per figure, at its step."""

    def __init__(self, entry: str, path: Path, summary_writer):
        self.name = entry
        self._writer = summary_writer(log_dir=str(_folder(entry, path)), flush_secs=TB_FLUSH_S)

    def write(self, step: int, figures: dict, now: float) -> None:
        for name, value in figures.items():
            self._writer.add_scalar(name, value, step, walltime=now)

    def close(self) -> None:
        self._writer.close()


class _MLflow:
    """A run of experiment "tunekit", started here and ended at close. An active run of your own
    (``mlflow.start_run()``) on the same tracking URI is logged into instead, and left open."""

    def __init__(self, entry: str, uri: str, mlflow):
        self.name, self._metric, local = entry, mlflow.entities.Metric, _local_dir(uri)
        if local is not None:
            uri = _folder(entry, local).as_uri()
        try:
            self._client = client = mlflow.MlflowClient(tracking_uri=uri)
            active, theirs = mlflow.active_run(), mlflow.get_tracking_uri()
            if active is not None and (_local_dir(theirs) == local if local else theirs.rstrip("/") == uri.rstrip("/")):
                self._run, self._ours = active.info.run_id, False
            else:
                known = client.get_experiment_by_name(EXPERIMENT)
                experiment = known.experiment_id if known else client.create_experiment(EXPERIMENT)
                self._run, self._ours = client.create_run(experiment).info.run_id, True
        except Exception as e:
            if local is not None and "MLFLOW_ALLOW_FILE_STORE" in str(e):   # recent MLflow: opt-in
                raise ValueError(f"log_to {entry!r}: MLflow {mlflow.__version__} keeps runs in a folder only "
                                 "with MLFLOW_ALLOW_FILE_STORE=true in the environment: set it, or give a server "
                                 "(mlflow:http://HOST:5000) or a database (mlflow:sqlite:///PATH.db)") from None
            raise OSError(f"log_to {entry!r}: MLflow cannot log to {uri}: {type(e).__name__}: {e}") from e

    def write(self, step: int, figures: dict, now: float) -> None:
        self._client.log_batch(self._run, [self._metric(k, v, int(now * 1000), step) for k, v in figures.items()])

    def close(self) -> None:
        if self._ours:
            self._client.set_terminated(self._run)


OPENERS = {"tensorboard": _TensorBoard, "mlflow": _MLflow, "jsonl": _Jsonl}


def _load(entry: str, scheme: str):
    """What the sink needs from its optional package (nothing for jsonl), or ImportError with the pip command."""
    try:
        if scheme == "tensorboard":
            import tensorboard  # noqa: F401  torch's writer needs it and says so less plainly
            from torch.utils.tensorboard import SummaryWriter
            return SummaryWriter
        if scheme == "mlflow":
            import mlflow
            return mlflow
    except ImportError as e:
        missing = missing_extra(e, f"log_to {entry!r}")   # not installed: said as every missing extra is
        if missing is not None:
            raise missing from None
        raise ImportError(f"log_to {entry!r} needs {scheme}, which is installed but cannot be imported ({e}): "
                          f"{pip_command(scheme)}") from e


def _parse(log_to) -> list[tuple[str, object, str]]:
    """(scheme, target, entry) for each entry: a path resolved, a server URI as given."""
    log_to = () if log_to is None else [log_to] if isinstance(log_to, str) else log_to
    if not isinstance(log_to, Iterable) or isinstance(log_to, (bytes, Mapping)):
        raise ValueError(f"log_to must be {FORMS}, a list of them, or None; got {log_to!r}")
    out, seen = [], {}
    for entry in log_to:
        scheme, colon, rest = entry.partition(":") if isinstance(entry, str) else ("", "", "")
        if scheme not in OPENERS or not colon:
            raise ValueError(f"log_to entries must be {FORMS}, got {entry!r}")
        if not rest.strip():
            raise ValueError(f"log_to {entry!r} is empty after '{scheme}:': write {FORMS}")
        target = str(_local_dir(rest) or rest) if scheme == "mlflow" else Path(rest).expanduser().resolve()
        if (scheme, str(target)) in seen:
            raise ValueError(f"log_to names the {scheme} target {target} twice "
                             f"({seen[scheme, str(target)]!r} and {entry!r}): give each target once")
        seen[scheme, str(target)] = entry
        out.append((scheme, target, entry))
    return out


def _figures(metrics) -> dict:
    """``{"tunekit/<name>": float}`` of the finite values; None, NaN and +-inf are left out."""
    if not isinstance(metrics, Mapping):
        raise TypeError(f"metrics must be a dict of name -> number, got {type(metrics).__name__}")
    out = {}
    for name, v in metrics.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"metric names must be non-empty strings, got {name!r}")
        if v is None:
            continue
        if hasattr(v, "item") and getattr(v, "ndim", None) == 0:   # numpy scalar, 0-d tensor
            v = v.item()
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"metrics[{name!r}] must be a number or None, got {type(v).__name__} {v!r}"[:200])
        v = float(v)
        if math.isfinite(v):
            out[PREFIX + name] = v
    return out


def _warn(sink, what: str, e: BaseException) -> None:
    warnings.warn(f"tunekit: the sink {sink.name!r} {what}: {type(e).__name__}: {e}", RuntimeWarning, stacklevel=3)


class Sinks:
    """The sinks ``open_sinks`` opened: ``write`` after each step, ``close`` at the end; false when none.
    Example: ``sinks = open_sinks("jsonl:run.jsonl"); sinks.write(1, {"loss": 2.5}); sinks.close()``."""

    def __init__(self, sinks=()):
        self._sinks = list(sinks)

    def write(self, step: int, metrics: dict) -> None:
        """Each finite figure as ``tunekit/<name>`` at ``step``; None, NaN and +-inf are skipped (no
        write when none is left). A sink that raises warns once and is dropped. A wrong step or value
        (a string, a bool) raises before any sink is written. A CUDA tensor's ``.item()`` syncs.
        Example: ``sinks.write(3, {"loss": torch.tensor(2.5), "grad_norm": float("nan")})`` writes loss only."""
        step = validate.whole("step", step, minimum=0)
        figures = _figures(metrics)
        if not figures:
            return
        now = time.time()
        for sink in list(self._sinks):
            try:
                sink.write(step, figures, now)
            except Exception as e:
                self._sinks.remove(sink)
                with contextlib.suppress(Exception):   # broken already: the warning says so
                    sink.close()
                _warn(sink, "failed and is dropped (the other sinks go on)", e)

    def close(self) -> None:
        """Flush and close every sink (ending the MLflow run it started); warns, never raises, for a
        sink's error. Example: ``sinks.close(); sinks.close()`` (the second does nothing)."""
        sinks, self._sinks = self._sinks, []
        for sink in sinks:
            try:
                sink.close()
            except Exception as e:
                _warn(sink, "failed to close", e)

    def __bool__(self) -> bool:
        return bool(self._sinks)

    def __repr__(self) -> str:
        return f"Sinks({', '.join(s.name for s in self._sinks) or 'none'})"


def open_sinks(log_to: str | Iterable[str] | None) -> Sinks:
    """The sinks ``log_to`` names, each checked and opened now, before any training.

    ``log_to``: "tensorboard:DIR" (``pip install 'tunekit[tensorboard]'``), "mlflow:URI" (a tracking
    URI; a plain path or ``file:`` URI is a local folder store; ``pip install 'tunekit[mlflow]'``),
    "jsonl:PATH" (appended), or a list of them; None or ``()``: no sinks. Paths resolve against the
    current folder. MLflow logs into your active run on the same tracking URI and leaves it open;
    else it starts a run in experiment "tunekit" and ends it at close. Raises ValueError (a wrong
    form, an empty path, a target twice), ImportError (a missing package, with the pip command),
    OSError or ValueError (a target that cannot be written or does not answer). Nothing is made
    before every package is found; a failure closes the sinks already opened.
    Example: ``open_sinks(["tensorboard:runs/tb", "jsonl:runs/steps.jsonl"])``."""
    targets = _parse(log_to)
    needs = {entry: _load(entry, scheme) for scheme, _, entry in targets}
    opened = []
    try:
        for scheme, target, entry in targets:
            opened.append(OPENERS[scheme](entry, target, needs[entry]))
    except BaseException:
        Sinks(opened).close()
        raise
    return Sinks(opened)
