"""What a profiled cell or block leaves behind, and the history of them. Pure: no torch.

A figure that could not be measured on this machine is NaN (numbers) or None (labels), never 0;
`notes` says why.
"""
from __future__ import annotations

import math
import threading
from dataclasses import asdict, dataclass, field, fields

from tunekit.core.breakdown import short
from tunekit.core.slowed import slowed_by

NaN = math.nan


@dataclass(slots=True)
class ProfileRecord:
    """One profiled cell or block. Times in seconds, memory in bytes, FLOPs as plain counts.

    Example: ``rec = tunekit.last(); rec.wall_s, rec.tflops``.

    Slotted: one is kept per profiled cell for the whole session, and its 40-odd fields would
    overflow Python's shared-key instance dicts (a dict of its own, ~2 KiB and one more object
    for the garbage collector to traverse, per record); pickle and copy handle slots."""

    name: str
    wall_s: float = NaN
    flops: float = NaN            # executed FLOPs (recomputation included): HFU
    flops_source: str = "none"    # counted | cached | inert (runs no op: 0, no counter) | given | none
    model_flops: float = NaN      # FLOPs the model needs (no recomputation): MFU
    tflops: float = NaN           # executed FLOPs / wall_s; NaN when timed under the counter
    mfu: float = NaN
    hfu: float = NaN
    peak_tflops: float = NaN
    peak_tflops_source: str | None = None  # which spec row, calibration or given figure peak_tflops is
    above_peak: str | None = None  # why MFU/HFU are past 100% (core.bounds); None when they are not
    dtype: str | None = None      # the dtype whose peak was used
    cpu_rss_delta_bytes: float = NaN
    cpu_peak_delta_bytes: float = NaN
    gpu_alloc_delta_bytes: float = NaN
    gpu_peak_delta_bytes: float = NaN
    gpu_reserved_bytes: float = NaN
    nvml_used_bytes: float = NaN
    device: str | None = None
    error: str | None = None      # "ExcType: message" when the cell raised or was interrupted
    recompute_flops: float = NaN  # executed during backward to rebuild activations
    mfu_convention: str | None = None  # how model_flops was obtained (tunekit.core.formulas)
    started_at: float = NaN       # time.time() at the start
    # experiment() leak check (ipyexperiments): consumed = kept at the end, reclaimed = freed
    exp_cpu_consumed_bytes: float = NaN
    exp_cpu_reclaimed_bytes: float = NaN
    exp_gpu_consumed_bytes: float = NaN
    exp_gpu_reclaimed_bytes: float = NaN
    gpu_alloc_retries: float = NaN  # torch.cuda.memory_stats() num_alloc_retries over the block
    gpu_ooms: float = NaN           # ... and num_ooms
    energy_j: float = NaN           # NVML GPU and/or RAPL CPU-package energy (tunekit.measure.energy)
    energy_source: str | None = None
    mean_w: float = NaN
    trace: object = None            # core.breakdown.Breakdown of a traced run (--trace)
    memory: object = None           # core.breakdown.MemoryTimeline (--memory)
    conditions: object = None       # core.conditions.Conditions: what else used the machine meanwhile
    explained: str | None = None    # --trace --plan P: the traced step against P's expected step, one line
    notes: list = field(default_factory=list)

    def __repr__(self) -> str:  # a terminal: the summary the magic shows (core.summary.to_text)
        from tunekit.core.summary import to_text

        return to_text(self)

    def _repr_html_(self) -> str:
        from tunekit.core.summary import to_html

        return to_html(self)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["slowed_by"] = slowed_by(self)  # from the objects: a trace whose one line is "" still slowed the cell
        d["notes"] = "; ".join(self.notes)
        d["trace"], d["memory"] = short(self.trace), short(self.memory)  # one line each in history()
        cond = self.conditions
        d["conditions"] = None if cond is None else cond.verdict        # quiet | busy | unknown
        d["conditions_reason"] = None if cond is None else cond.reason
        return d


COLUMNS = tuple(f.name for f in fields(ProfileRecord)) + ("conditions_reason", "slowed_by")


class History:
    """Thread-safe append-only list of records with a DataFrame view."""

    def __init__(self):
        self._records: list[ProfileRecord] = []
        self._lock = threading.Lock()

    def append(self, rec: ProfileRecord) -> ProfileRecord:
        with self._lock:
            self._records.append(rec)
        return rec

    def last(self) -> ProfileRecord | None:
        with self._lock:
            return self._records[-1] if self._records else None

    def records(self) -> list[ProfileRecord]:
        with self._lock:
            return list(self._records)

    def clear(self) -> None:
        with self._lock:
            self._records.clear()

    def __len__(self) -> int:
        return len(self._records)

    def to_frame(self):
        """pandas.DataFrame with one row per record and the columns of `COLUMNS`."""
        import pandas as pd  # lazy: `import tunekit` must not pay for pandas

        return pd.DataFrame([r.to_dict() for r in self.records()], columns=list(COLUMNS))

