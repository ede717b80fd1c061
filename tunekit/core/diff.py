"""What changed between two runs: ``tunekit.diff(a, b)``. Pure: no torch; pandas and plotly only
inside the methods that draw.

    >>> d = tunekit.diff(lab.runs[-2], lab.runs[-1])     # two Lab runs (or two profiled records)
    >>> print(d.summary)     # the setting that changed, the step time, and what moved it most
    >>> d.table              # the rows that changed most: a, b and the change (d.table_all: every row)
    >>> d.figure()           # time by op category, side by side

Two Lab runs (`RunResult`, or their log records) or two profiled cells/blocks/Monitor summaries
(`ProfileRecord`) are compared: step time and rates, memory, and where both were traced the time by
op category, per module scope and per op, with the ops added and removed (the casts bf16 brings, say). Runs of
different models, or of different kinds, are refused: a diff is one model under two settings.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from tunekit.core import validate
from tunekit.core.breakdown import TOP_OPS, UNTRACED, Breakdown, as_breakdown
from tunekit.core.explain import PROFILER_SHOWN
from tunekit.core.fmt import FORMATS, fmt_bytes, fmt_count, fmt_flops, fmt_ms, fmt_pct, fmt_ratio, fmt_tflops, formatted
from tunekit.core.notes import Note
from tunekit.core.records import ProfileRecord
from tunekit.core.refusals import user_facing
from tunekit.core.results import RunResult
from tunekit.core.summary import readable
from tunekit.core.units import is_missing

NaN = math.nan
MODULE = "nn.Module: "   # how torch.profiler names a module's scope
SHOWN = 15               # rows `Diff.table` shows by default: what a reader takes in at a glance
_TRACED = ("time by category", "modules", "ops")   # rows of the traced step, in seconds of it
COLUMNS = ["section", "what", "a", "b", "change", "unit", "calls_a", "calls_b"]

# (field, what, format) per kind of record: the figures a diff shows, step first, then memory
RUN_FIGURES = (("step_s", "step time", "s"), ("step_s_min", "fastest step", "s"), ("tokens_per_s", "tokens/s", "rate"),
               ("tflops", "TFLOPS", "tflops"),
               ("mfu", "MFU", "pct"), ("peak_tflops", "MFU's peak", "tflops"),
               ("flops_per_step", "FLOPs per step", "flops"),
               ("loss", "loss (last step)", "loss"), ("peak_mem_bytes", "peak memory", "bytes"),
               ("params_bytes", "parameters", "bytes"),
               ("grads_bytes", "gradients", "bytes"), ("optimizer_bytes", "optimizer states", "bytes"),
               ("saved_bytes", "saved activations", "bytes"), ("weight_cast_bytes", "weight casts", "bytes"))
CELL_FIGURES = (("wall_s", "time", "s"), ("tflops", "TFLOPS", "tflops"), ("mfu", "MFU", "pct"),
                ("peak_tflops", "MFU's peak", "tflops"),
                ("flops", "FLOPs", "flops"), ("cpu_peak_delta_bytes", "CPU peak", "bytes"),
                ("gpu_peak_delta_bytes", "GPU peak", "bytes"), ("gpu_reserved_bytes", "GPU reserved", "bytes"))


def _number(v) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else NaN


def _fmt(v: float, kind: str) -> str:
    if is_missing(v):
        return "n/a"
    if kind in ("rate", "loss"):
        return formatted(v, FORMATS["tokens/s" if kind == "rate" else "loss"])
    return {"s": _time, "bytes": fmt_bytes, "count": fmt_count, "flops": fmt_flops, "pct": fmt_pct,
            "tflops": fmt_tflops}[kind](v)


def _time(s: float) -> str:
    """A time in ms, one decimal; under a millisecond in microseconds (516 us is not '0.5 ms')."""
    return fmt_ms(s, us_below_ms=True)


@dataclass
class Diff:
    """Two runs side by side. ``rows``: dicts of section, what, a, b, change (b / a - 1), unit (and an
    op's calls on each side, ``calls_a`` / ``calls_b``).
    ``added`` / ``removed``: ops traced in one run and not in the other, with their seconds and calls."""

    a: str                      # what each side is, in words
    b: str
    kind: str                   # "run" | "record"
    changed: list               # the settings that differ: (name, a, b)
    rows: list
    added: list = field(default_factory=list)
    removed: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    shown: int | None = SHOWN   # rows `table` shows (those that changed most); None: every row
    per_step: tuple | None = None   # Lab runs: (tokens per step of a, of b, their unit): a step of
                                    # 2x the tokens is compared per token, not as a 2x slower step

    @property
    def table_all(self):
        """pandas DataFrame, every row: section, what, a, b, change (relative; NaN where either side
        is unknown), unit, and for an op its calls on each side."""
        import pandas as pd

        return pd.DataFrame(self.rows, columns=COLUMNS)

    def weight(self, row: dict) -> float:
        """How much a row changed, as a share: a figure's relative change; a traced category's,
        module's or op's change in seconds over the traced step (the longer side's sum of
        categories), so that a rare op doubling from 1 µs weighs what it cost. 0 where unknown."""
        if row["section"] in _TRACED:
            step = max((sum(r[s] for r in self.rows if r["section"] == "time by category") for s in "ab"),
                       default=0.0)
            return abs(row["b"] - row["a"]) / step if step > 0 else 0.0
        return abs(row["change"]) if not is_missing(row["change"]) else 0.0

    @property
    def table(self):
        """`table_all`'s ``shown`` rows that changed most (`weight`), in its order, a DataFrame shown
        formatted with a line saying how many rows are left out and how to see them."""
        keep = sorted(sorted(range(len(self.rows)), key=lambda i: -self.weight(self.rows[i]))[:self.shown])
        left = len(self.rows) - len(keep)
        rest = (f"{left} more rows left out (those shown changed most): .table_all, or "
                "tunekit.diff(a, b, rows=None), has every row") if left else None
        return readable(self.table_all.iloc[keep].reset_index(drop=True), _view, rest=rest)

    def _row(self, section: str, what: str) -> dict | None:
        return next((r for r in self.rows if r["section"] == section and r["what"] == what), None)

    @property
    def moved_most(self) -> dict | None:
        """The op category whose time changed the most, in seconds (None without two traces)."""
        cats = [r for r in self.rows if r["section"] == "time by category" and not is_missing(r["a"])
                and not is_missing(r["b"]) and r["what"] != UNTRACED]
        return max(cats, key=lambda r: abs(r["b"] - r["a"]), default=None)

    @property
    def summary(self) -> str:
        """A few lines: what changed, the step time, and the change that moved it most."""
        lines = [f"{self.b} vs {self.a}"]
        if self.changed:
            lines.append("changed: " + ", ".join(f"{n} {a} -> {b}" for n, a, b in self.changed))
        # the fastest steps where both runs have them: load only slows a step, so the fastest is the
        # least disturbed; else the mean
        word, step = "fastest step", self._row("step", "fastest step")
        if not (step and not is_missing(step["a"]) and not is_missing(step["b"])):
            word, step = "step", self._row("step", "step time" if self.kind == "run" else "time")
        if step and not is_missing(step["a"]) and not is_missing(step["b"]) and step["a"] > 0 and step["b"] > 0:
            ratio = step["a"] / step["b"]
            sized = self.per_step and self.per_step[0] != self.per_step[1] and min(self.per_step[:2]) > 0
            if sized:                                   # steps of different sizes: compare per token
                ratio *= self.per_step[1] / self.per_step[0]
            how = ("the same, within 0.5%" if f"{ratio:.2f}" == f"{1 / ratio:.2f}" == "1.00" else
                   f"{fmt_ratio(ratio)} faster" if ratio >= 1 else f"{fmt_ratio(1 / ratio)} slower")
            if sized:
                na, nb, unit = self.per_step
                how = f"{na:,.0f} -> {nb:,.0f} {unit} a step: {how} per {unit.removesuffix('s')}"
            lines.append(f"{word} {_time(step['a'])} -> {_time(step['b'])} ({how})")
        peak = self._row("memory", "peak memory" if self.kind == "run" else "CPU peak")
        if peak and not is_missing(peak["a"]) and not is_missing(peak["b"]):
            lines.append(f"peak memory {fmt_bytes(peak['a'])} -> {fmt_bytes(peak['b'])} "
                         f"({fmt_bytes(peak['b'] - peak['a'], signed=True)})")
        most = self.moved_most
        if most is not None:
            delta = most["b"] - most["a"]
            lines.append(f"moved most: {most['what']} {_time(most['a'])} -> {_time(most['b'])} "
                         f"({'+' if delta >= 0 else '-'}{_time(abs(delta))})")
        for word, ops in (("added", self.added), ("removed", self.removed)):
            if ops:
                lines.append(f"ops {word}: " + ", ".join(f"{o['op']} ({_time(o['self_s'])}, {o['calls']} calls)"
                                                          for o in ops[:3]))
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.summary

    def text(self, ops: int = 10) -> str:
        """The summary, then every figure as aligned text (the ``ops`` ops that moved most)."""
        rows = [r for r in self.rows if r["section"] not in ("ops", "modules")]
        for section in ("modules", "ops"):
            rows += [r for r in self.rows if r["section"] == section][:ops]
        cells = [(r["section"], r["what"], _fmt(r["a"], r["unit"]), _fmt(r["b"], r["unit"]),
                  "n/a" if is_missing(r["change"]) else fmt_pct(r["change"], signed=True)) for r in rows]
        head = ("", "", self.a, self.b, "change")
        widths = [max(len(c[i]) for c in cells + [head]) for i in range(5)]
        out = [self.summary, ""] + ["  ".join(c[i].ljust(widths[i]) if i < 2 else c[i].rjust(widths[i])
                                             for i in range(5)).rstrip() for c in [head] + cells]
        return "\n".join(out)

    def figure(self, title: str | None = None):
        """plotly: time by op category of each run, side by side (needs two traced runs)."""
        import plotly.graph_objects as go

        cats = [r for r in self.rows if r["section"] == "time by category"]
        if not cats:
            raise ValueError("no time by category to draw: trace both runs (lab.run(trace=True), "
                             "%%gpuprofile --trace) and diff them again")
        fig = go.Figure()
        for side, name in (("a", self.a), ("b", self.b)):
            fig.add_bar(name=name, x=[r["what"] for r in cats],
                        y=[(r[side] if not is_missing(r[side]) else 0.0) * 1e3 for r in cats])
        fig.update_layout(barmode="group", yaxis_title="ms per traced step",
                          title=title or "time by op category: " + self.summary.splitlines()[0])
        return fig


def _view(df):
    """The table as read: a and b in their units, the change in %."""
    cells = {side: [_fmt(v, u) for v, u in zip(df[side], df["unit"])] for side in ("a", "b")}
    change = ["n/a" if is_missing(c) else fmt_pct(c, signed=True) for c in df["change"]]
    return df.assign(**cells, change=change).drop(columns=["unit"])


def _side(x):
    if isinstance(x, dict):
        return RunResult.from_dict(x)
    if isinstance(x, (RunResult, ProfileRecord)):
        return x
    raise TypeError(f"tunekit.diff compares two Lab runs (RunResult or a log record) or two profiled "
                    f"records (ProfileRecord: tunekit.last(), a Monitor's summary); got {type(x).__name__}")


def _change(va: float, vb: float) -> float:
    """b / a - 1; 0 where both are 0 (unchanged); NaN where either is missing or a alone is 0."""
    if is_missing(va) or is_missing(vb):
        return NaN
    return vb / va - 1 if va else 0.0 if vb == 0 else NaN


@user_facing   # a refusal: the user's line and the message (core.refusals)
def diff(a, b, rows: int | None = SHOWN) -> Diff:
    """What changed from run ``a`` to run ``b`` (see the module's docstring). Refused before any
    work: two records of different kinds, or Lab runs of different models. ``rows``: how many rows
    ``.table`` shows, those that changed most (None: every row, as ``.table_all``).

    Example: ``print(tunekit.diff(lab.runs[-2], lab.runs[-1]).summary)``."""
    a, b = _side(a), _side(b)
    shown = None if rows is None else validate.whole("rows", rows)
    if type(a) is not type(b):
        raise TypeError(f"tunekit.diff compares records of one kind: got a {type(a).__name__} and a "
                        f"{type(b).__name__}")
    notes = []
    if isinstance(a, RunResult):
        kind, figures = "run", RUN_FIGURES
        if (a.model, a.n_params) != (b.model, b.n_params):
            raise ValueError(f"these runs trained different models ({a.model}, {fmt_count(a.n_params)} parameters "
                             f"vs {b.model}, {fmt_count(b.n_params)}): a diff compares one model under two "
                             "settings")
        names = (f"run #{a.run_id} ({a.label})", f"run #{b.run_id} ({b.label})")
        ta, tb = a.toggles, b.toggles
        changed = [(f, getattr(ta, f), getattr(tb, f)) for f in ta.__dataclass_fields__
                   if getattr(ta, f) != getattr(tb, f)]
        changed += [(f, getattr(a, f), getattr(b, f)) for f in ("device", "parallel", "world_size")
                    if getattr(a, f) != getattr(b, f)]
        per_step = (_number(a.tokens_per_step), _number(b.tokens_per_step), a.throughput_unit or "tokens")
        if a is b or (a.run_id, a.session, a.time, a.label) == (b.run_id, b.session, b.time, b.label):
            notes.append(Note("diff.same_run", f"both sides are {names[0]}: nothing can have changed; tunekit.diff("
                                               "lab.runs[-2], lab.runs[-1]) compares a Lab's last two runs"))
        failed = [n for n, r in zip(names, (a, b)) if r.status != "ok"]
        if failed:
            notes.append(Note("diff.failed_run", f"{' and '.join(failed)} did not finish: its figures are n/a"))
    else:
        kind, figures = "record", CELL_FIGURES
        names, changed, per_step = (a.name, b.name), [], None
    rows = []
    for fname, what, unit in figures:
        va, vb = _number(getattr(a, fname, None)), _number(getattr(b, fname, None))
        if is_missing(va) and is_missing(vb):
            continue      # measured on neither side: left out, not shown as 0
        section = "memory" if unit == "bytes" else "step"   # the loss is the step's too
        rows.append({"section": section, "what": what, "a": va, "b": vb,
                     "change": _change(va, vb), "unit": unit})
    peaks = [_number(getattr(r, "peak_tflops", None)) for r in (a, b)]
    if all(not is_missing(p) for p in peaks) and peaks[0] != peaks[1]:   # each MFU against its own dtype's peak
        said = [f"{getattr(r, 'compute_dtype', None) or getattr(r, 'dtype', None) or 'its'} {fmt_tflops(p)}"
                for r, p in zip((a, b), peaks)]
        times = ("step times" if not per_step or per_step[0] == per_step[1]
                 else f"times per {per_step[2].rstrip('s')}")
        notes.append(Note("diff.peaks", f"each side's MFU is against its own peak ({said[0]} -> {said[1]}): the "
                                        f"MFUs do not compare, the {times} do"))
    busy = [n for n, r in zip(names, (a, b)) if getattr(r.conditions, "busy", False) is True]
    if busy:
        notes.append(Note("diff.busy", f"{' and '.join(busy)} ran on a busy machine: a change in time may be "
                                       "the machine, not the setting"))
    added, removed = _traces(as_breakdown(a.trace), as_breakdown(b.trace), rows, notes)
    return Diff(names[0], names[1], kind, changed, rows, added, removed, notes, shown,
                per_step if per_step and not any(is_missing(n) for n in per_step[:2]) else None)


def _by_op(top_ops) -> dict:
    """op -> its seconds and calls, over every scope the trace attributed it to."""
    out = {}
    for o in top_ops:
        seen = out.setdefault(o["op"], {"op": o["op"], "self_s": 0.0, "calls": 0})
        seen["self_s"] += o["self_s"]
        seen["calls"] += o["calls"]
    return out


def _traces(ta: Breakdown | None, tb: Breakdown | None, rows: list, notes: list) -> tuple[list, list]:
    """Time by category and the ops added/removed, where both runs were traced."""
    if ta is None or tb is None:
        if ta is not None or tb is not None:
            notes.append(Note("diff.one_trace", "only one run was traced: trace both to see which ops moved"))
        return [], []
    if ta.device != tb.device:
        notes.append(Note("diff.devices", f"traced on {ta.device} and {tb.device}: categories compare, "
                                          "op names do not"))
    slowed = [o for o in (ta.overhead, tb.overhead) if not is_missing(o)]
    if slowed and max(slowed) > PROFILER_SHOWN:
        notes.append(Note("diff.profiler", "the profiler slowed the traced steps (by "
                                           f"{' and '.join(fmt_pct(o, 0) for o in slowed)}): the time by category "
                                           "is of those steps and need not add up to, or move with, the step time"))
    pa, pb = ta.parts(), tb.parts()
    for cat in sorted(set(pa) | set(pb), key=lambda c: -max(pa.get(c, 0.0), pb.get(c, 0.0))):
        va, vb = pa.get(cat, 0.0), pb.get(cat, 0.0)
        if va == 0.0 and vb == 0.0:
            continue      # a category neither step spent time in
        rows.append({"section": "time by category", "what": cat, "a": va, "b": vb,
                     "change": vb / va - 1 if va else NaN, "unit": "s"})
    oa, ob = _by_op(ta.top_ops), _by_op(tb.top_ops)
    for op in sorted(set(oa) & set(ob), key=lambda o: -abs(ob[o]["self_s"] - oa[o]["self_s"])):
        va, vb = oa[op]["self_s"], ob[op]["self_s"]
        module = op.startswith(MODULE)    # the profiler's module scopes: their own time, beside the ops'
        rows.append({"section": "modules" if module else "ops", "what": op.removeprefix(MODULE) if module else op,
                     "a": va, "b": vb, "change": vb / va - 1 if va else NaN,
                     "unit": "s", "calls_a": oa[op]["calls"], "calls_b": ob[op]["calls"]})
    added = [ob[o] for o in ob if o not in oa]
    removed = [oa[o] for o in oa if o not in ob]
    if (added or removed) and max(len(oa), len(ob)) >= TOP_OPS:
        notes.append(Note("diff.top_ops", f"ops added/removed among the {len(oa)} and {len(ob)} ops with the most "
                                          "time each trace kept: an op below that cut may still have run"))
    return added, removed
