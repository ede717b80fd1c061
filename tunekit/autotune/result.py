"""The records of an autotune search: each `Candidate` considered and the `AutotuneResult`.
Measures nothing (``AutotuneResult.figure`` is drawn by its view).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

from tunekit.core.conditions import combine, first_reason
from tunekit.core.fmt import fmt_pct, fmt_rate
from tunekit.core.notes import of_kind
from tunekit.core.toggles import Toggles, label
from tunekit.measure.timing import stats

BUSY_RETRIES = 2       # a trial measured busy is measured again up to twice


@dataclass
class Candidate:
    """One configuration the search considered, and what became of it."""

    stage: str
    toggles: Toggles
    runs: list = field(default_factory=list)   # RunResults of its trials, busy ones included
    status: str = "waiting"    # waiting | racing | winner | kept | tied | dropped | pruned | failed | not run
    why: str = ""
    fits: bool | None = None
    seconds: float = 0.0       # wall time its trials took
    repeats: int = 0           # repeats measured (a busy trial measured again counts once)

    def judged(self) -> list:
        """The runs its figures come from: those not measured busy; all of them when every one
        was busy (then ``busy`` is True and no decision rests on them)."""
        return [r for r in self.runs if not measured_busy(r)] or list(self.runs)

    @property
    def busy(self) -> bool:
        """Every trial was measured on a busy machine: shown, never judged."""
        return bool(self.runs) and all(measured_busy(r) for r in self.runs)

    @property
    def busy_trials(self) -> int:
        return sum(measured_busy(r) for r in self.runs)

    def scores(self) -> list[float]:
        """tokens/s of each judged repeat at its fastest step."""
        return [r.tokens_per_step / r.step_s_min for r in self.judged()]

    @property
    def score(self) -> float:
        """The best repeat's tokens/s: what decides. Contention only ever adds time, and on shared
        cores a whole run can be slowed many times over, so the fastest repeat is the estimate a
        busy neighbour cannot drag down (the median can be, with two repeats)."""
        return max(self.scores(), default=math.nan)

    @property
    def median(self) -> float:
        """The median of the repeats' tokens/s (``measure.timing.stats`` on seconds per token)."""
        s = stats([1 / v for v in self.scores()])
        return 1 / s["median_s"] if s["repeats"] else math.nan

    @property
    def spread(self) -> float:
        """(max - min) / median of the repeats' tokens/s; NaN with fewer than two repeats."""
        v = self.scores()
        return (max(v) - min(v)) / self.median if len(v) >= 2 else math.nan

    def best_runs(self, n: int = 2) -> list:
        """The ``n`` fastest judged repeats (what the noise band compares)."""
        return sorted(self.judged(), key=lambda r: r.step_s_min / r.tokens_per_step)[:n]


def measured_busy(run) -> bool:
    """The run was measured on a busy machine (its figures decide nothing)."""
    cond = getattr(run, "conditions", None)
    return cond is not None and cond.busy


@dataclass
class AutotuneResult:
    """What ``lab.autotune`` found. ``toggles``/``run``: the winner and its median repeat (None
    when nothing could be measured); ``evidence``: every candidate (a DataFrame);
    ``within_noise``: the top two are not apart beyond the noise band (``runner_up`` is the other);
    ``inconclusive``: the band could not separate the winner from ``tied`` even after the
    tiebreak (the winner is the incumbent kept, not a proven best); ``busy``: candidates measured
    on a busy machine in every trial (never judged); ``status``: complete | budget | interrupted;
    ``state``: what the live model was left with.

    Example: ``found = lab.autotune(budget_s=120); found.verdict, found.evidence``."""

    toggles: Toggles | None
    run: object
    candidates: list
    within_noise: bool
    runner_up: Toggles | None
    band: float
    elapsed_s: float
    budget_s: float
    status: str
    state: str
    start: Toggles
    notes: list = field(default_factory=list)
    close_calls: list = field(default_factory=list)  # stages whose finalists were within noise
    tied: list = field(default_factory=list)   # Toggles the noise band cannot separate from the winner
    busy: list = field(default_factory=list)   # labels of candidates measured busy in every trial

    @property
    def partial(self) -> bool:
        return self.status != "complete"

    @property
    def inconclusive(self) -> bool:
        """The top candidates could not be told apart: the winner is only the incumbent kept."""
        return bool(self.tied)

    @property
    def conditions(self):
        """The machine over every trial (`core.conditions.combine`): busy if any trial was."""
        return combine([r.conditions for c in self.candidates for r in c.runs if getattr(r, "conditions", None)])

    @property
    def machine(self) -> str:
        """The machine over every trial, in one sentence (printed beside the conclusions)."""
        runs = [r for c in self.candidates for r in c.runs]
        busy = [r.conditions for r in runs if measured_busy(r)]
        cond = self.conditions
        if cond is None:
            return "Machine: not checked"
        if not busy:
            return f"Machine: {cond.verdict} in all {len(runs)} trials"
        return (f"Machine: busy in {len(busy)} of {len(runs)} trials ({first_reason(busy[0].reason)}); each was "
                f"measured again (up to {BUSY_RETRIES} times) and only quiet trials were judged")

    @property
    def verdict(self) -> str:
        """One paragraph: the winner, its speed-up over the start, and how sure that is."""
        base = next((c for c in self.candidates if c.toggles == self.start and c.runs), None)
        win = next((c for c in self.candidates if c.status == "winner"), None)

        def name(t):
            return label(t, self.start)

        if win is None:
            text = "nothing was measured"
        elif self.inconclusive:
            tied = [next(c for c in self.candidates if c.toggles == t) for t in self.tied]  # best first
            text = (f"INCONCLUSIVE: the measurements cannot tell {name(win.toggles)} ({fmt_rate(win.score)}) "
                    "from " + "; ".join(f"{name(c.toggles)} ({c.score / win.score:.2f}x)" for c in tied)
                    + f" (noise band ±{fmt_pct(self.band, 0)}"
                    + (", measured busy" if win.busy or any(c.busy for c in tied) else "")
                    + f"). {name(win.toggles)} is kept because "
                    "nothing beat it beyond noise, not because it was shown fastest: re-run when the "
                    "machine is quiet, or give the search more budget")
        else:
            gain = f", {win.score / base.score:.2f}x the start's tokens/s" if base and base is not win else \
                ("; the starting configuration stays: nothing beat it beyond noise" if base is win else "")
            if base and base is not win and (base.busy or win.busy):
                gain = "; its gain over the start is not judged: measured on a busy machine"
            text = f"winner: {name(win.toggles)} at {fmt_rate(win.score)}{gain}"
            if self.within_noise and self.runner_up is not None:
                text += (f". The top two are within noise (band ±{fmt_pct(self.band, 0)}): "
                         f"{label(self.runner_up, self.start)} is as fast on this machine")
            if self.close_calls:
                text += (". Close calls (within noise, so either choice is as fast here): "
                         + "; ".join(self.close_calls))
        faster = of_kind(self.notes, "autotune.unconfirmed")
        if faster:
            text += ". Not confirmed: " + faster[0]
        if self.busy:
            text += (". Never measured on a quiet machine, so not judged: " + ", ".join(self.busy))
        if win is not None:
            text += ". " + self.machine
        if self.status == "budget":
            text += f". STOPPED EARLY: the budget of {self.budget_s:g} s was spent; the result is partial"
        elif self.status == "interrupted":
            text += ". INTERRUPTED: the result is partial"
        return text + f" ({self.elapsed_s:.1f} s; {self.state})."

    @cached_property
    def evidence(self):
        """pandas DataFrame, one row per candidate, in the order they were considered."""
        import pandas as pd

        rows = []
        for c in self.candidates:
            t = c.toggles
            rows.append({"stage": c.stage, "label": label(t, self.start), "precision": t.precision,
                         "attention": t.attention, "optimizer": t.optimizer,
                         "checkpointing": t.checkpointing, "micro_batch": t.micro_batch,
                         "grad_accum": t.grad_accum, "compile": t.compile, "repeats": len(c.runs),
                         "steps": sum(r.steps for r in c.runs), "tokens_per_s": c.score,
                         "tokens_per_s_median": c.median, "spread": c.spread,
                         "peak_mem_bytes": max((r.peak_mem_bytes for r in c.runs
                                                if r.peak_mem_bytes is not None), default=math.nan),
                         "fits": c.fits, "status": c.status, "why": c.why, "seconds": c.seconds,
                         "busy_trials": c.busy_trials,
                         "run_ids": [r.run_id for r in c.runs]})
        return pd.DataFrame(rows)

    @cached_property
    def figure(self):
        """plotly Figure of the evidence (drawn by its view)."""
        from tunekit.autotune.view import autotune_figure
        return autotune_figure(self)

    def __repr__(self):  # a terminal: winner, gain, noise, machine, state (core.run_text); .verdict says it in words
        from tunekit.core.run_text import autotune_text
        return autotune_text(self)

    def _repr_html_(self) -> str:
        from tunekit.core.run_text import autotune_html
        return autotune_html(self)

