"""What slowed a profiled cell's wall time (`slowed_by`). Pure: no torch. Its own module: a record
(`core.records`) writes it into its row, and the views (`core.summary`, `view.axes`) read it back.
"""
from __future__ import annotations

from tunekit.core.units import is_missing

_UNSET = object()
# what makes a record's wall time incomparable: the measuring ran inside the timed block
_SLOWERS = (("flops_source", "FLOP counting", lambda v: v == "counted"),   # FlopCounterMode's dispatch
            ("trace", "profiler trace", lambda v: _present(v)),            # torch.profiler records every op
            ("memory", "memory history", lambda v: _present(v)))           # ... and every allocation


def slowed_by(row) -> str | None:
    """What slowed a profiled cell's wall time, or None: the FLOP counter runs in the cell it
    counts ('counted'), a torch.profiler trace (``trace=True``) or memory timeline
    (``memory=True``) records every op. The one rule behind every "slowed" mark (history table,
    plot_history, the report); a row that already carries ``slowed_by`` (a history frame, even
    the curated one without ``trace``/``memory``) is read as it is.

    Example: ``slowed_by({"flops_source": "cached", "trace": "12 ops"})`` is 'profiler trace'."""
    get = row.get if hasattr(row, "get") else (lambda k, d=None: getattr(row, k, d))
    v = get("slowed_by", _UNSET)
    if v is not _UNSET:
        return v if _present(v) else None
    why = [what for key, what, on in _SLOWERS if on(get(key, None))]
    return " and ".join(why) or None


def _present(v) -> bool:
    return not is_missing(v) and v != ""
