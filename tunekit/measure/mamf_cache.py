"""The calibration cache: MAMF calibrations as JSON in ``$TUNEKIT_CACHE/mamf.json`` (or
``~/.cache/tunekit``), one entry per device, dtype, torch version, thread count and, on a CPU,
libgomp's wait policy (measure.conditions_gomp; as the stream record's key has it). Reading
trusts only entries exactly as `tunekit.measure.peaks.calibrate` writes them; writing is atomic.
Measurement layer.
"""
from __future__ import annotations

import json
import math
import os
import stat
import tempfile
import time
import warnings
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

from tunekit.core import paths
from tunekit.core.conditions import Conditions
from tunekit.core.registry import DTYPES
from tunekit.core.units import is_missing
from tunekit.measure.priority import shielded_verdict


@dataclass
class Calibration:
    """One MAMF sweep: the best TFLOPS, the shape and layout that reached it, and how it was taken."""

    device: str
    dtype: str
    tflops: float
    best_shape: tuple
    sweep: list            # [(m, k, n, tflops), ...]
    seconds: float
    torch_version: str
    threads: int
    layout: str            # "nn" (A @ B) or "nt" (A @ B.T, how nn.Linear keeps its weight): the faster
    taken_at: float        # time.time(); entries written before this field and `layout` are re-measured
    busy: float = math.nan  # caches before `conditions`: other runnable tasks per CPU (1-min load average)
    conditions: Conditions | None = None  # what else used the machine during the sweep (None: older cache)
    raised: str | None = None  # a re-check's faster matmul replaced the swept peak: from what, when
    priority: str = "normal"   # what its CPU trials ran at (measure.priority): "realtime" ones are load-proof
    wait_policy: str | None = None   # a CPU's libgomp wait policy as its trials ran (None: a GPU's, or older)

    @property
    def verdict(self) -> str:
        return shielded_verdict(self.conditions, self.priority)


STALE_DAYS = 30      # a calibration older than this is re-measured (drivers, BIOS, thermals change)
BUSY_LIMIT = 0.5     # caches before `conditions`: other runnable tasks per CPU that mean "taken under load"


def stale(cal: Calibration) -> bool:
    return time.time() - cal.taken_at > STALE_DAYS * 86400


def distrust(cal: Calibration) -> str | None:
    """Why a cached calibration should not be used as it is, or None."""
    if stale(cal):
        return f"older than {STALE_DAYS} days"
    if cal.conditions is not None:
        return f"it was taken on a busy machine ({cal.conditions.reason})" if cal.verdict == "busy" else None
    if not is_missing(cal.busy) and cal.busy > BUSY_LIMIT:  # an older cache's load-average reading
        return f"it was taken under load ({cal.busy:.1f} other tasks per CPU)"
    return None


def cache_path() -> Path:
    """The cache file (under tunekit.core.paths.cache_dir, like every tunekit cache)."""
    return paths.cache_dir() / "mamf.json"


def entry_key(name: str, dtype: str, torch_version: str, threads: int, wait_policy: str | None = None) -> str:
    """The key of a calibration: device name, dtype, torch version, thread count and, for a CPU's,
    libgomp's wait policy (a CPU's matmuls on a few threads run at another speed under another policy,
    so a sweep taken under one is never read under another; None: a GPU's, no policy in the key).

    >>> entry_key("EPYC", "fp32", "2.13.0", 2, "default")
    'EPYC|fp32|torch 2.13.0|2 threads|omp default'
    """
    base = f"{name}|{dtype}|torch {torch_version}|{threads} threads"
    return base if wait_policy is None else f"{base}|omp {wait_policy}"


# the fields an entry must have; later ones have defaults, so older cache files still load
_CAL_FIELDS = {f.name for f in fields(Calibration) if f.default is MISSING and f.default_factory is MISSING}
_ALL_FIELDS = {f.name for f in fields(Calibration)}  # later fields have defaults: older caches still load
_memo: dict = {}


def from_entry(c: dict) -> Calibration:
    """A cache entry back as a Calibration; fields a newer tunekit added are ignored."""
    known = {f.name for f in fields(Calibration)}
    c = {k: v for k, v in c.items() if k in known}
    c["best_shape"] = tuple(c["best_shape"])
    if "conditions" in c:
        c["conditions"] = Conditions.from_dict(c["conditions"])
    return Calibration(**c)


def load() -> dict:
    """The calibration cache, re-read only when the file changed. A file that is not a JSON
    object (binary junk, a directory, a FIFO: never opened) or an entry that is not a calibration
    tunekit wrote is ignored, with one warning: it is re-measured, never used."""
    path = cache_path()
    try:
        st = path.stat()
    except OSError:
        return {}
    stamp = (str(path), st.st_mtime_ns, st.st_size)
    if _memo.get("stamp") != stamp:
        data, why = {}, None
        if not stat.S_ISREG(st.st_mode):  # reading a FIFO would wait for a writer forever
            why = "it is not a regular file"
        else:
            try:
                data = json.loads(path.read_bytes())
            except (OSError, ValueError) as e:  # unreadable, not UTF-8, not JSON
                why = f"it cannot be read as JSON ({type(e).__name__})"
        if not isinstance(data, dict):
            data, why = {}, "it is not a JSON object"
        _memo["data"] = {k: v for k, v in data.items() if is_calibration(k, v)}
        if why is None and len(_memo["data"]) < len(data):
            why = f"{len(data) - len(_memo['data'])} of its {len(data)} entries are not calibrations"
        if why:
            warnings.warn(f"tunekit: ignored the calibration cache {path} where {why}; those calibrations "
                          "are measured again", stacklevel=3)
        _memo["stamp"] = stamp
    return dict(_memo["data"])


def is_calibration(key, v) -> bool:
    """An entry as calibrate() writes it: exactly Calibration's fields, each of its type and
    range, under the key of its own device, dtype, torch version and threads."""
    if not isinstance(v, dict) or not _CAL_FIELDS <= set(v) <= _ALL_FIELDS:
        return False
    busy = v.get("busy")   # NaN or absent now; a load per CPU (>= 0) in caches written before `conditions`
    if not (is_missing(busy)
            or (isinstance(busy, (int, float)) and not isinstance(busy, bool) and 0 <= busy < float("inf"))):
        return False
    if v.get("conditions") is not None and Conditions.from_dict(v["conditions"]) is None:
        return False
    if not (v.get("raised") is None or isinstance(v["raised"], str)):
        return False
    policy = v.get("wait_policy")
    if not (policy is None or isinstance(policy, str)):
        return False

    def num(x):
        return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < float("inf")

    def count(x):
        return isinstance(x, int) and not isinstance(x, bool) and x >= 1

    texts = all(isinstance(v[k], str) for k in ("device", "dtype", "torch_version", "layout"))
    return (texts and v["dtype"] in DTYPES and v["layout"] in ("nn", "nt") and count(v["threads"])
            and num(v["tflops"]) and v["tflops"] > 0 and num(v["seconds"])
            and num(v["taken_at"]) and isinstance(v["best_shape"], list) and len(v["best_shape"]) == 3
            and all(count(n) for n in v["best_shape"]) and isinstance(v["sweep"], list)
            and all(isinstance(r, list) and len(r) == 4 and all(num(x) for x in r) for r in v["sweep"])
            and _own_key(key, entry_key(v["device"], v["dtype"], v["torch_version"], v["threads"]), policy))


def _own_key(key: str, base: str, policy: str | None) -> bool:
    """Whether ``key`` is an entry's own: its policy's key where it records one (as calibrate writes
    it); else (a GPU's, or an entry from before the policy was recorded) ``base`` or any policy's."""
    if policy is not None:
        return key == f"{base}|omp {policy}"
    return key == base or key.startswith(f"{base}|omp ")


def save(data: dict) -> None:
    """Write the cache: a private temp file, then an atomic rename (a failure is a warning)."""
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # a private temp file per writer, then an atomic rename: concurrent writers never
        # see half a file or each other's temp file
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".mamf-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1)
            os.replace(tmp, path)
        except OSError:
            os.unlink(tmp)  # e.g. mamf.json is a directory: leave no temp file behind
            raise
    except OSError as e:
        warnings.warn(f"tunekit: could not cache the calibration in {path.parent} ({e}); "
                      "set TUNEKIT_CACHE to a writable folder", stacklevel=4)
