"""The record of one run (``RunResult``) and its tables. Pure: no torch.

    >>> r = RunResult.from_dict(record)          # a log line; fields it lacks: None/NaN
    >>> results_frame([r])                        # pandas DataFrame, one row per run
    >>> runs_view(results_frame([r]))             # the columns a person reads first

The log these records are kept in is ``tunekit.lab.runlog``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

from tunekit.core.breakdown import short
from tunekit.core.conditions import Conditions
from tunekit.core.notes import decoded, from_json
from tunekit.core.run_text import common_unit, run_html, summary_lines
from tunekit.core.summary import mark_rates, mfu_peaks, readable
from tunekit.core.toggles import Toggles
from tunekit.core.units import MiB, is_missing


@dataclass
class RunResult:
    """One ``lab.run``: the toggles used and what was measured. Unmeasurable figures are None/NaN.

    The toggles are one ``Toggles`` object (``r.toggles``); each is also readable by name
    (``r.precision``). The log and the DataFrame hold them flattened, one column each.

    Example: ``r = lab.run(steps=10); r.tokens_per_s, r.peak_mem_bytes``.
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
    peak_mem_source: str              # which meter read peak_mem_bytes
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
    # what the device held as the timed steps started (CPU: RSS once freed heap pages were handed
    # back; CUDA: torch-allocated); peak_mem_bytes - this = what the steps themselves added
    peak_mem_start_bytes: float | None = None
    minor_faults_per_step: float | None = None  # the process's minor page faults over the timed steps, a step
    trace: object = None                  # core.breakdown.Breakdown (run(trace=True)); a dict when read back
    memory: object = None                 # core.breakdown.MemoryTimeline (run(memory=True))
    # distributed runs (tunekit.parallel); None for a single-process run
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
    throughput_unit: str = "tokens"       # what tokens_per_step counted: "tokens" | "samples" (no sequence dimension)
    explained: str | None = None          # a traced run against its plan's expected step, in one line
    step_s_median: float = math.nan       # median of the timed steps: the steady step, a slow outlier aside
    step_s_iqr: float = math.nan          # their interquartile range (seconds): the run's own spread
    # lab.expect's answer for this run's setting, made before it ran (NaN: none was asked)
    expected_step_s: float = math.nan
    expected_peak_bytes: float = math.nan
    expected_from: int | None = None      # the run that calibrated that expectation (None: the device model)
                                          # (tunekit.explain's .line); None: untraced, or a note says why
    job: dict | None = None               # the cluster job that ran it (engine, id, partition, nodes, state,
                                          # exit code, folder, jobs that shared its nodes); None: run here
    # libgomp's OpenMP wait policy a CPU run's threads ran under ('default', or the variables set:
    # 'OMP_WAIT_POLICY=PASSIVE'; measure.conditions_gomp), as a calibration records it; None: a GPU run
    wait_policy: str | None = None

    # () -> the run's Explanation, planned by the Lab that ran it (tunekit.explain(run) without a
    # plan); set by the Lab on its live runs, never saved: a run read back from a log has none
    explainer = None

    def __getstate__(self) -> dict:   # pickled without the explainer (it holds its Lab)
        return {k: v for k, v in self.__dict__.items() if k != "explainer"}

    def __repr__(self) -> str:  # a terminal: a few aligned lines (core.run_text), every field still one attribute away
        return "\n".join(summary_lines(self))

    def _repr_html_(self) -> str:
        return run_html(self)

    def __getattr__(self, name):  # r.precision, r.micro_batch, ...: the toggles by name
        if name in toggle_fields() and "toggles" in self.__dict__:
            return getattr(self.toggles, name)
        raise AttributeError(f"'RunResult' object has no attribute {name!r}")

    @property
    def steady_step_s(self) -> float:
        """The step a run settles at: the median of its timed steps (one slow step, a burst of load
        or a first-step cost, aside), the mean where the record has no median (older logs)."""
        m = self.step_s_median
        return m if isinstance(m, (int, float)) and not is_missing(m) and m > 0 else self.step_s

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
        return cls.from_dict({"label": label, **t.toggles.asdict(), "status": "failed", "error": reason,
                              "notes": list(notes), "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                              **fields})

    @classmethod
    def from_dict(cls, d: dict) -> "RunResult":
        """From a log record; a field it lacks (an older or newer tunekit wrote it) is None/NaN."""
        nested = d.get("toggles") if isinstance(d.get("toggles"), dict) else {}
        known = {k: v for k, v in {**d, **nested}.items() if k in toggle_fields() and v is not None}
        kw = {"toggles": Toggles().replace(**known)}
        for f in dataclasses.fields(cls):
            if f.name == "toggles":
                continue
            v = d.get(f.name if f.name in d else OLD_KEYS.get(f.name, f.name))
            if v is None and f.name in _FLOAT_FIELDS:
                v = math.nan
            elif v is None and f.name == "notes":
                v = []
            elif f.name == "notes":   # a log keeps a Note as {"kind", "text"} (core.notes)
                v = [from_json(n) for n in v]
            elif f.name in ("trace", "memory"):   # and so do the notes of a trace read back as a dict
                v = decoded(v)
            elif v is None and f.name == "status":
                v = "ok"
            elif v is None and f.name == "throughput_unit":
                v = "tokens"   # logs written before the unit was recorded counted tokens
            elif f.name == "conditions":
                v = Conditions.from_dict(v)
            kw[f.name] = v
        return cls(**kw)


def toggle_fields() -> tuple:
    """The toggles as declared now (`Toggles`' fields): a record's attributes and the table's columns,
    a toggle declared after import included."""
    return tuple(f.name for f in dataclasses.fields(Toggles))


TOGGLE_TYPES = {f.name: f.type for f in dataclasses.fields(Toggles)}
# key in logs written before -> the field that holds it now (read by from_dict and the log's checks)
OLD_KEYS = {"peak_mem_source": "peak_source"}
RECORD_TYPES = {**{f.name: f.type for f in dataclasses.fields(RunResult) if f.type not in ("object", "Toggles")},
                **TOGGLE_TYPES}   # the log keeps the toggles flattened
RECORD_TYPES.update({old: RECORD_TYPES[new] for new, old in OLD_KEYS.items()})
_FLOAT_FIELDS = {"tokens_per_s", "step_s", "step_s_min", "step_s_max", "tflops", "mfu", "hfu",
                 "loss", "loss_first", "energy_j", "mean_w", "j_per_token", "expected_step_s", "expected_peak_bytes",
                 "step_s_median", "step_s_iqr"}


def results_frame(runs: list[RunResult]):
    """pandas DataFrame, one row per run, toggles flattened, notes joined into one string."""
    import pandas as pd

    rows = [{**r.to_dict(), "notes": "; ".join(r.notes), "trace": short(r.trace), "memory": short(r.memory),
             "conditions": None if r.conditions is None else r.conditions.verdict,
             "conditions_reason": None if r.conditions is None else r.conditions.reason}
            for r in runs]
    for row, r in zip(rows, runs):   # lab.expect's answer against the steady measured step: expected / measured - 1
        e, m = row["expected_step_s"], r.steady_step_s
        row["expected_ms"] = e * 1e3 if _number(e) else math.nan
        row["expect_error"] = e / m - 1 if _number(e) and _number(m) and m > 0 else math.nan
    rest = [f.name for f in dataclasses.fields(RunResult) if f.name not in ("run_id", "label", "toggles")]
    rest += ["conditions_reason", "expected_ms", "expect_error"]
    return pd.DataFrame(rows, columns=["run_id", "label", *toggle_fields(), *rest])


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not is_missing(v)


# what lab.results() holds unless asked for every column: what ran, its speed, step time, compute,
# peak memory, the machine and the outcome (throughput_unit and above_peak: the view's header and marks;
# compute_dtype and peak_tflops: the peak each row's MFU/HFU is against, its own dtype's)
RESULT_COLUMNS = ("run_id", "label", "tokens_per_s", "throughput_unit", "step_s", "tflops", "mfu", "hfu",
                  "compute_dtype", "peak_tflops", "peak_mem_bytes", "conditions", "status", "above_peak",
                  "expected_ms", "expect_error")


def runs_table(runs: list[RunResult], all: bool = False, more: str = "lab.results(all=True)"):
    """``runs`` as ``lab.results()`` and ``Lab.load_results()`` both return them: the curated
    columns (``RESULT_COLUMNS``) shown formatted, ``more`` said under the table as the call with
    every column; ``all=True``: every column, a plain DataFrame. Raw numbers either way.

    Example: ``runs_table(lab.runs, all=True)["notes"]``."""
    df = results_frame(runs)
    return df if all else readable(df[list(RESULT_COLUMNS)], runs_view, more)


_VIEW = {"run_id": "#", "label": "run", "tokens_per_s": "tokens/s", "step_ms": "step (ms)",
         "tflops": "TFLOPS", "mfu": "MFU", "hfu": "HFU", "mfu_peak": "MFU/HFU of", "peak_mem_mib": "peak (MiB)",
         "saved_mib": "saved (MiB)", "loss": "loss", "attention_ran": "attn ran",
         "flops_source": "FLOPs", "conditions": "machine", "status": "status",
         "expected_ms": "expected (ms)", "expect_error": "expected vs median step"}
_SHOWN_IF_ANY = ("expected_ms", "expect_error")   # columns a view shows only where some row has one


def runs_view(df):
    """The columns a person reads first, with units in the headers (dashboard, report, and
    ``lab.results()``): those of them ``df`` has, the curated frame or every column. Throughput
    is headed samples/s for runs that counted samples. MFU and HFU are each against the peak of
    their row's own compute dtype, which the 'MFU/HFU of' column names ('bf16 65 TFLOPS')."""
    from tunekit.core.summary import machine_word

    derived = {"step_ms": ("step_s", 1e3), "peak_mem_mib": ("peak_mem_bytes", 1 / MiB),
               "saved_mib": ("saved_bytes", 1 / MiB)}
    view = df.assign(**{k: df[src].astype(float) * f for k, (src, f) in derived.items() if src in df})
    if "conditions" in df:
        view = view.assign(conditions=df["conditions"].map(machine_word))
    if "peak_tflops" in df and "compute_dtype" in df:
        view = view.assign(mfu_peak=mfu_peaks(df["compute_dtype"], df["peak_tflops"]))
    view = mark_rates(view, df["above_peak"] if "above_peak" in df else [None] * len(df))
    unit = common_unit(df["throughput_unit"]) if "throughput_unit" in df else "tokens"
    shown = [c for c in _VIEW if c in view and (c not in _SHOWN_IF_ANY or view[c].notna().any())]
    return view[shown].rename(columns={**_VIEW, "tokens_per_s": f"{unit}/s"})
