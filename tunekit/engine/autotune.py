"""The fastest configuration that fits, found within a time budget. Engine layer.

    >>> found = lab.autotune(budget_s=120)        # tokens/s; every trial is a real lab.run
    >>> found.toggles, found.verdict              # the winner, and how sure the search is
    >>> found.evidence                            # every candidate: tried, dropped, pruned, why
    >>> found.figure                              # plotly: tokens/s per candidate, noise bars

The search goes one toggle at a time, in the order the documents give, each stage starting from
the winner of the one before (the incumbent):

1. precision first: it changes what fits (fp16 only on CUDA; tf32 is fp32 off CUDA, so not tried);
2. attention kind (flash only where the flash-attn package is installed, on CUDA, in half precision);
3. the optimizer's kernel: the same algorithm as the starting optimizer in its other
   implementations (AdamW loop/foreach vs fused), never another algorithm: that would change the
   training, not only its speed;
4. micro-batch, through the Lab's max-batch search. Activation checkpointing "slows things down
   for the given batch size" and only pays through the bigger batch it lets fit, so it is tried
   only at micro-batches that do not fit without it, and not at all when memory is not the limit.
   With ``keep_global_batch=True`` the micro-batches divide the global batch and ``grad_accum``
   makes up the rest, so every candidate trains the same global batch;
5. a final race: the winner against the two best other candidates of all stages, to two more
   repeats each (a stage decided while a burst of load slowed one side is decided again);
6. torch.compile last, on the winner (its first compile costs tens of seconds);
7. a tiebreak: top candidates the noise band cannot separate from the winner (the band is wider
   than the gap between them, or one was only measured busy) get the rest of the budget in
   alternating repeats. If they stay inseparable the result is ``inconclusive``: it says so, and
   its chart draws them tied, since the winner is then only the incumbent kept.

Within a stage the candidates race (successive halving): each round measures every survivor once
more (one ``lab.run`` of ``steps`` timed steps); from the second round on (one trial may have met
a burst of load) the better half goes on and a candidate slower than the leader beyond the noise
band drops out, so weak candidates get two trials and the close ones ``repeats``. A repeat's
score is ``tokens_per_step / step_s_min`` and a candidate's the best of its repeats: contention
on a shared machine only ever adds time (the reading of ``tunekit.repeat_agreement``). A
challenger replaces the incumbent only if it beats it beyond the noise band: ``max(noise, how far
the two fastest repeats of either disagree)``. The evidence also gives each candidate's median.

Every trial carries the machine's conditions (``RunResult.conditions``). A trial measured busy is
measured again (up to ``BUSY_RETRIES`` times, while the budget allows) and stays in the evidence,
but figures from busy trials decide nothing: a candidate measured busy in every trial is never
dropped, never wins against another, and the result lists it in ``busy``.

The budget is checked before every trial: a trial that would start after ``budget_s`` (or, from
what the trials so far cost, end after it) is not run; the result then says the search stopped
early and which stages it did not finish. Ctrl-C stops the search the same way, keeps what was
measured in ``lab.last_autotune`` and raises. Afterwards the weights (and, when the optimizer is
the starting one, its state) are back as before the search, which is a measurement, not training;
``keep="winner"`` (the default) then applies the winner and makes it ``lab.defaults``,
``keep="start"`` puts the starting toggles back. ``result.state`` says which happened.
"""
from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass, field
from functools import cached_property

from ..core import registry
from ..core.conditions import combine, first_reason
from ..core.runlog import repeat_agreement
from ..core.toggles import TF32_ON_CPU, ToggleError, Toggles, label, normalized
from ..core.validate import is_whole
from ..measure.interrupts import deferred_interrupt
from ..measure.oom import is_oom
from ..measure.timing import stats
from .guard import NonFiniteRunError, Snapshot

OBJECTIVES = ("tokens_per_s",)
BUSY_RETRIES = 2       # a trial measured busy is measured again up to twice
TIEBREAK_ROUNDS = 2    # x repeats: the most extra repeats inseparable top candidates get
STAGES = ("precision", "attention", "optimizer", "micro_batch", "final", "compile")
SPACE_KEYS = ("precision", "attention", "optimizer", "checkpointing", "micro_batch", "compile")
KEEP = ("winner", "start")
_KNOWN = {"precision": tuple(registry.PRECISIONS), "attention": tuple(registry.ATTENTIONS),
          "optimizer": registry.LAB_OPTIMIZERS, "checkpointing": (False, True), "compile": (False, True)}


# --- how a trial is run: the Lab by default, a fake in tests ---------------------------------


class LabTrials:
    """Runs the search's trials on a Lab: ``measure`` is one ``lab.run`` (so every trial is in
    ``lab.results()``), ``max_batch`` the Lab's max-batch search. Tests pass an object with the
    same three methods to inject measurements."""

    def __init__(self, lab, warmup: int, memory_budget_bytes=None):
        self.lab, self.warmup = lab, warmup
        self.memory_budget_bytes = memory_budget_bytes

    def measure(self, t: Toggles, steps: int):
        return self.lab.run(steps=steps, warmup=self.warmup, **t.asdict())

    def max_batch(self, t: Toggles, limit: int) -> int | None:
        found = self.lab.find_max_batch_size(start=1, limit=limit, memory_budget_bytes=self.memory_budget_bytes,
                                             **t.replace(micro_batch=1).asdict())
        return found.best

    def clock(self) -> float:
        return time.perf_counter()


# --- the records --------------------------------------------------------------------------


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
        return [r for r in self.runs if not _busy(r)] or list(self.runs)

    @property
    def busy(self) -> bool:
        """Every trial was measured on a busy machine: shown, never judged."""
        return bool(self.runs) and all(_busy(r) for r in self.runs)

    @property
    def busy_trials(self) -> int:
        return sum(_busy(r) for r in self.runs)

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


def _busy(run) -> bool:
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
    ``state``: what the live model was left with."""

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
        busy = [r.conditions for r in runs if _busy(r)]
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
            text = (f"INCONCLUSIVE: the measurements cannot tell {name(win.toggles)} ({win.score:,.0f} tokens/s) "
                    "from " + "; ".join(f"{name(c.toggles)} ({c.score / win.score:.2f}x)" for c in tied)
                    + f" (noise band ±{self.band:.0%}" + (", measured busy" if win.busy or any(c.busy for c in tied)
                                                         else "") + f"). {name(win.toggles)} is kept because "
                    "nothing beat it beyond noise, not because it was shown fastest: re-run when the "
                    "machine is quiet, or give the search more budget")
        else:
            gain = f", {win.score / base.score:.2f}x the start's tokens/s" if base and base is not win else \
                ("; the starting configuration stays: nothing beat it beyond noise" if base is win else "")
            if base and base is not win and (base.busy or win.busy):
                gain = "; its gain over the start is not judged: measured on a busy machine"
            text = f"winner: {name(win.toggles)} at {win.score:,.0f} tokens/s{gain}"
            if self.within_noise and self.runner_up is not None:
                text += (f". The top two are within noise (band ±{self.band:.0%}): "
                         f"{label(self.runner_up, self.start)} is as fast on this machine")
            if self.close_calls:
                text += (". Close calls (within noise, so either choice is as fast here): "
                         + "; ".join(self.close_calls))
        faster = [n for n in self.notes if "measured faster than the winner" in n]
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
        """plotly Figure of the evidence (drawn by the UI layer)."""
        from ..ui.autotune_view import autotune_figure
        return autotune_figure(self)

    def __repr__(self):
        return f"AutotuneResult({self.verdict})"


_BUSY_WHY = "measured on a busy machine in every trial, so not judged"


class _Stop(Exception):
    """The budget does not allow the next trial."""


# --- the search -----------------------------------------------------------------------------


def autotune(lab, budget_s: float = 60.0, objective: str = "tokens_per_s", *, keep_global_batch=False,
             max_micro_batch=None, steps: int = 3, warmup: int = 1, repeats: int = 3, noise: float = 0.03,
             memory_budget_bytes=None, space: dict | None = None, keep: str = "winner",
             compile_s: float = 60.0, trial_s: float = 0.25, progress=None, trials=None) -> AutotuneResult:
    """Search the fastest legal configuration from ``lab``'s current toggles; see the module doc.

    ``budget_s``: seconds for the whole search. ``max_micro_batch``: the largest micro-batch tried
    (default: the global batch with ``keep_global_batch``, else 8x the starting micro-batch).
    ``steps``/``warmup``: per trial (one ``lab.run``), ``steps`` at least: once a step time is
    known, a trial runs enough steps to fill ``trial_s`` (up to 10x ``steps``) so that a fast
    configuration gets many chances of an undisturbed step; ``repeats``: measurements the
    finalists of a stage get; ``noise``: the smallest relative difference taken as real. ``space``: restrict a
    toggle's values, e.g. ``{"precision": ["fp32", "bf16"], "compile": [False]}``. ``compile_s``:
    budget left that the compile stage needs to start. ``progress(elapsed_s, budget_s, text)``
    is called before each trial. ``trials``: an object like ``LabTrials`` (tests inject one).
    """
    start = lab.resolve()
    errors = _check_args(lab, start, budget_s, objective, keep_global_batch, max_micro_batch, steps,
                         warmup, repeats, noise, space, keep, compile_s)
    if memory_budget_bytes is not None and (isinstance(memory_budget_bytes, bool) or not isinstance(
            memory_budget_bytes, numbers.Real) or not 0 < memory_budget_bytes < math.inf):
        errors.append(f"memory_budget_bytes must be a finite number > 0 or None (got {memory_budget_bytes!r}).")
    if isinstance(trial_s, bool) or not isinstance(trial_s, numbers.Real) or not 0 <= trial_s < math.inf:
        errors.append(f"trial_s must be a finite number >= 0 (got {trial_s!r}).")
    if progress is not None and not callable(progress):
        errors.append(f"progress must be a function (elapsed_s, budget_s, text) or None (got {progress!r}).")
    if errors:
        raise ToggleError(errors)
    start = normalized(start)
    trials = trials or LabTrials(lab, int(warmup), memory_budget_bytes)
    search = _Search(lab, trials, start, float(budget_s), keep_global_batch, max_micro_batch, int(steps),
                     float(trial_s), int(repeats), float(noise), dict(space or {}), float(compile_s), progress)
    snap = Snapshot.take(lab)
    status = "complete"
    try:
        search.run()
    except _Stop:
        status = "budget"
    except KeyboardInterrupt:
        status = "interrupted"
        with deferred_interrupt():
            result = _finish(lab, search, snap, status, keep)
        raise
    finally:
        if status != "interrupted":
            result = _finish(lab, search, snap, status, keep)
    return result


def timed_steps(step_s: float, steps: int, trial_s: float) -> int:
    """Timed steps filling ``trial_s`` at ``step_s`` per step, within [steps, 10 x steps]
    (``steps`` when ``step_s`` is unknown: 0 or NaN)."""
    if not step_s > 0:
        return steps
    return max(steps, min(10 * steps, math.ceil(trial_s / step_s)))


def _check_args(lab, start, budget_s, objective, keep_global_batch, max_micro_batch, steps, warmup,
                repeats, noise, space, keep, compile_s) -> list[str]:
    out = []

    def positive(name, v):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0 < v < math.inf:
            out.append(f"{name} must be a finite number > 0 (got {v!r}).")

    positive("budget_s", budget_s)
    positive("compile_s", compile_s)
    if objective not in OBJECTIVES:
        out.append(f"objective must be one of {OBJECTIVES} (got {objective!r}).")
    if not isinstance(keep_global_batch, bool):
        out.append(f"keep_global_batch must be True or False (got {keep_global_batch!r}).")
    if max_micro_batch is not None and (not is_whole(max_micro_batch) or max_micro_batch < 1):
        out.append(f"max_micro_batch must be a whole number >= 1 or None (got {max_micro_batch!r}).")
    for name, v, low in (("steps", steps, 1), ("warmup", warmup, 0), ("repeats", repeats, 1)):
        if not is_whole(v) or v < low:
            out.append(f"{name} must be a whole number >= {low} (got {v!r}).")
    if isinstance(noise, bool) or not isinstance(noise, numbers.Real) or not 0 <= noise < 1:
        out.append(f"noise must be a number in [0, 1): a relative difference (got {noise!r}).")
    if space is not None:
        if not isinstance(space, dict):
            out.append(f"space must be a dict of toggle -> values (got {type(space).__name__}).")
        else:
            for k, v in space.items():
                if k not in SPACE_KEYS:
                    out.append(f"space: {k!r} is not searched; one of {SPACE_KEYS}.")
                elif not isinstance(v, (list, tuple)) or not v:
                    out.append(f"space[{k!r}] must be a non-empty list of values (got {v!r}).")
                elif any(x not in _KNOWN[k] for x in v) if k in _KNOWN else \
                        not all(is_whole(x) and x >= 1 for x in v):
                    known = _KNOWN.get(k, "whole numbers >= 1")
                    out.append(f"space[{k!r}] may hold only {known} (got {v!r}).")
    if keep not in KEEP:
        out.append(f"keep must be one of {KEEP} (got {keep!r}).")
    out += [f"the starting toggles cannot run: {p}" for p in lab.check(start, steps if is_whole(steps) else 1)]
    return out


class _Search:
    def __init__(self, lab, trials, start, budget_s, keep_global_batch, max_micro_batch, steps, trial_s,
                 repeats, noise, space, compile_s, progress):
        self.lab, self.trials, self.start, self.budget_s = lab, trials, start, budget_s
        self.keep_global = keep_global_batch
        self.global_batch = start.micro_batch * start.grad_accum
        default_limit = self.global_batch if keep_global_batch else 8 * start.micro_batch
        self.limit = int(max_micro_batch) if max_micro_batch is not None else default_limit
        if keep_global_batch:
            self.limit = min(self.limit, self.global_batch)
        self.steps, self.trial_s = steps, trial_s
        self.repeats, self.noise, self.space = repeats, noise, space
        self.compile_s, self.progress = compile_s, progress
        self.env = lab.env()
        self.by_key: dict[tuple, Candidate] = {}
        self.order: list[Candidate] = []
        self.notes: list[str] = []
        self.close_calls: list[str] = []  # stage decisions whose finalists were within noise
        self.done: list[str] = []
        self.stage = ""
        self.t0 = trials.clock()
        self.incumbent = self._candidate("start", start)
        self.incumbent.why = "the starting configuration"
        self.within_noise, self.runner_up, self.band = False, None, noise
        self.tied: list[Candidate] = []  # top candidates the band cannot separate from the winner

    # --- bookkeeping -----------------------------------------------------------------------

    def elapsed(self) -> float:
        return self.trials.clock() - self.t0

    def _candidate(self, stage, t: Toggles) -> Candidate:
        key = tuple(t.asdict().values())
        if key not in self.by_key:
            self.by_key[key] = c = Candidate(stage, t)
            self.order.append(c)
        return self.by_key[key]

    def _allowed(self, name, values):
        wanted = self.space.get(name)
        return [v for v in values if wanted is None or v in wanted]

    def _prune(self, c: Candidate, why: str, fits=None) -> None:
        if c.status == "waiting":
            c.status, c.why, c.fits = "pruned", why, fits

    # --- one trial ------------------------------------------------------------------------

    def _predicted_s(self, c: Candidate, per_step: bool = False) -> float:
        """What ``c``'s trial will cost in training steps (warm-up and timed), scaled from the
        fastest run so far of its precision by the samples per step; 0 with nothing to go by.
        A first run's FLOP count and peak calibration are one-off costs and left out."""
        size = c.toggles.micro_batch * c.toggles.grad_accum
        seen = [(1 if per_step else r.steps + r.warmup) * r.step_s * size
                / (o.toggles.micro_batch * o.toggles.grad_accum)
                for o in self.order if o.toggles.precision == c.toggles.precision
                and o.toggles.compile == c.toggles.compile for r in o.runs]
        return min(seen, default=0.0)

    def steps_for(self, c: Candidate) -> int:
        """Timed steps for ``c``'s next trial: enough to fill ``trial_s`` at the step time seen
        so far for its precision (more steps, more chances of an undisturbed one), between
        ``steps`` and 10x ``steps``; ``steps`` when nothing was seen yet."""
        per_step = self._predicted_s(c, per_step=True)
        return timed_steps(per_step, self.steps, self.trial_s)

    def fits_budget(self, c: Candidate) -> bool:
        """A trial of ``c`` would end within the budget (from what its trials are predicted to cost)."""
        left = self.budget_s - self.elapsed()
        return left > 0 and self._predicted_s(c) <= left

    def measure(self, c: Candidate) -> bool:
        """One more repeat of ``c``; False when it failed (then it is out of the race). A trial
        measured on a busy machine is measured again, up to ``BUSY_RETRIES`` times while the
        budget allows: its figures are kept (in the evidence) but never judged."""
        if not self.fits_budget(c):
            raise _Stop
        for attempt in range(1 + BUSY_RETRIES):
            if not self.trial(c, attempt):
                return False
            if not _busy(c.runs[-1]) or attempt == BUSY_RETRIES or not self.fits_budget(c):
                break
        c.repeats += 1
        return True

    def trial(self, c: Candidate, attempt: int) -> bool:
        """One ``lab.run`` of ``c``, added to its runs; False when it failed."""
        if self.progress is not None:
            again = ", measured again: the machine was busy" if attempt else ""
            self.progress(self.elapsed(), self.budget_s,
                          f"{self.stage}: {label(c.toggles, self.start)} (repeat {c.repeats + 1}{again})")
        t0 = self.trials.clock()
        try:
            run = self.trials.measure(c.toggles, self.steps_for(c))
        except ToggleError as e:
            c.status, c.why = "pruned", "; ".join(e.problems)
            return False
        except NonFiniteRunError as e:
            c.status, c.why = "failed", str(e)
            return False
        except Exception as e:  # noqa: BLE001 - one failed candidate must not end the search
            if is_oom(e):
                c.status, c.why, c.fits = "failed", "out of memory", False
            else:
                c.status, c.why = "failed", f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            return False
        finally:
            c.seconds += self.trials.clock() - t0
        c.runs.append(run)
        c.fits = True
        return True

    # --- comparing --------------------------------------------------------------------------

    def band_of(self, a: Candidate, b: Candidate) -> float:
        """How far apart two scores must be to count: ``noise`` or, when larger, how far the two
        fastest repeats of either candidate disagree (``repeat_agreement``)."""
        worst, _ = repeat_agreement([a.best_runs(), b.best_runs()])
        return max(self.noise, worst - 1)

    def beats(self, a: Candidate, b: Candidate) -> bool:
        """``a`` is faster than ``b`` beyond the noise band, both measured on a quiet machine
        (figures from busy trials decide nothing)."""
        return not (a.busy or b.busy) and a.score > b.score * (1 + self.band_of(a, b))

    def holds(self, win: Candidate, c: Candidate) -> bool:
        """The measurements back ``win`` against ``c``: it beats ``c`` beyond the band, or the two
        are within ``noise`` of each other (a difference too small to count), both measured quiet.
        Otherwise ``c`` may be faster: the band is wider than the gap, or a side was only busy."""
        if self.beats(win, c):
            return True
        return not (win.busy or c.busy) and max(win.score, c.score) <= min(win.score, c.score) * (1 + self.noise)

    def race(self, cands: list[Candidate]) -> None:
        """Successive halving among ``cands`` (the incumbent first); sets the new incumbent."""
        inc = self.incumbent
        alive = [c for c in cands if c.status in ("waiting", "kept", "winner", "racing")]
        for c in alive:
            c.status = "racing"
        rnd = 0
        while alive:
            rnd += 1
            for c in list(alive):
                if c.repeats < rnd and not self.measure(c):
                    alive.remove(c)
            if not alive:
                break
            alive.sort(key=lambda c: c.score, reverse=True)
            if rnd < min(2, self.repeats):
                continue  # one repeat may have met a burst of load: nobody is judged on it alone
            leader = alive[0]
            for c in alive[1:]:
                if self.beats(leader, c):
                    c.status = "dropped"
                    c.why = (f"round {rnd}: {c.score / leader.score:.2f}x the tokens/s of "
                             f"{label(leader.toggles, self.start)}, beyond the noise band "
                             f"±{self.band_of(leader, c):.0%}")
            alive = [c for c in alive if c.status == "racing"]
            if len(alive) > 2:  # halving: the better half goes on (the incumbent stays while in noise)
                half = math.ceil(len(alive) / 2)
                for c in alive[half:]:
                    if c is not inc and not c.busy:  # a busy figure is no rank to drop on
                        c.status, c.why = "dropped", f"round {rnd}: not in the faster half"
                alive = [c for c in alive if c.status == "racing"]
            if len(alive) == 1 or all(c.repeats >= self.repeats for c in alive):
                break
        if not alive:
            return  # every candidate failed: the incumbent stays
        best = max(alive, key=lambda c: c.score)
        self.settle(inc, best, alive)
        best = max(alive, key=lambda c: c.score)
        if inc in alive and best is not inc and not self.beats(best, inc):
            best.status, best.why = "kept", (f"{best.score / inc.score:.2f}x the incumbent's tokens/s: "
                                            + (_BUSY_WHY if best.busy or inc.busy else
                                               f"within the noise band ±{self.band_of(best, inc):.0%}")
                                            + ", so the incumbent stays")
            best = inc
        if best is not inc and inc in alive:
            inc.status, inc.why = "dropped", (f"beaten beyond noise by {label(best.toggles, self.start)} "
                                              f"({best.score / inc.score:.2f}x, band ±{self.band_of(best, inc):.0%})")
        for c in alive:
            if c is not best and c.status == "racing":
                c.status, c.why = "kept", (f"finalist: {c.score / best.score:.2f}x the stage winner, "
                                           + (_BUSY_WHY if c.busy or best.busy else "not apart beyond noise"))
        # a close call is a tie within ``noise``; a wider gap the band could not resolve is left to the tiebreak
        self.close_calls += [f"{self.stage}: {label(c.toggles, self.start)} at {c.score / best.score:.2f}x "
                             f"{label(best.toggles, self.start)}" for c in alive
                             if c.status == "kept" and self.holds(best, c) and self.holds(c, best)]
        best.status = "winner"
        best.why = (f"won the {self.stage} stage" if best is not inc
                    else f"the incumbent: nothing beat it beyond noise in the {self.stage} stage")
        self.incumbent = best

    def settle(self, inc: Candidate, best: Candidate, alive: list) -> None:
        """A challenger ahead of the incumbent but inside the noise band gets more repeats, both
        of them alternately (up to 3x ``repeats``, while the budget lasts): the band comes from
        their two fastest repeats, which more repeats bring down toward the true speed, so a real
        10% gain is not lost to a noisy pair of trials (and a trial measured busy gets another
        chance of a quiet one). A tie that stays a tie keeps the incumbent."""
        while (inc in alive and best is not inc and best.score > inc.score and not self.beats(best, inc)
               and best.repeats < 3 * self.repeats):
            try:
                for c in (inc, best):
                    if not self.measure(c):
                        alive.remove(c)
                        return
            except _Stop:
                return  # the budget is spent: decide on what was measured

    # --- the stages -----------------------------------------------------------------------

    def run(self) -> None:
        for name in STAGES:
            self.stage = name
            getattr(self, f"stage_{name}")()
            self.done.append(name)
        if not self.incumbent.runs:  # every stage was pruned to the incumbent alone
            self.stage = "start"
            self.race([self.incumbent])
        self.tiebreak()
        self._top_two()

    def unseparated(self) -> list[Candidate]:
        """The two best measured candidates the winner does not hold against (`holds`)."""
        win = self.incumbent
        out = [c for c in self.order if c is not win and c.runs and c.status != "failed" and not self.holds(win, c)]
        return sorted(out, key=lambda c: c.score, reverse=True)[:2] if win.runs else []

    def tiebreak(self) -> None:
        """Top candidates the noise band cannot separate from the winner get the rest of the
        budget: alternating repeats of the winner and them (at most ``TIEBREAK_ROUNDS x repeats``
        rounds); one that then beats the winner beyond the band wins, one the winner beats drops.
        Those still inseparable make the result inconclusive (`_top_two`)."""
        self.stage = "tiebreak"
        for _ in range(TIEBREAK_ROUNDS * self.repeats):
            top = self.unseparated()
            if not top:
                return
            try:
                for c in (self.incumbent, *top):
                    if not self.measure(c):
                        return
            except _Stop:
                self.notes.append("the tiebreak between the top candidates ran until the budget was spent")
                return
            win = self.incumbent
            best = max(top, key=lambda c: c.score)
            if self.beats(best, win):
                win.status, win.why = "dropped", (
                    f"tiebreak: beaten beyond noise by {label(best.toggles, self.start)} "
                    f"({best.score / win.score:.2f}x, band ±{self.band_of(best, win):.0%})")
                best.status, best.why, self.incumbent = "winner", "won the tiebreak against the previous winner", best
            for c in top:
                if c is not self.incumbent and self.beats(self.incumbent, c):
                    c.status, c.why = "dropped", (f"tiebreak: {c.score / self.incumbent.score:.2f}x the winner's "
                                                  f"tokens/s, beyond the band ±{self.band_of(self.incumbent, c):.0%}")

    def _try(self, changes: list[dict], rule=None) -> None:
        """Race the incumbent against ``incumbent.replace(**c)`` for each change that is legal."""
        inc = self.incumbent
        cands = [inc]
        for ch in changes:
            t = inc.toggles.replace(**ch)
            c = self._candidate(self.stage, t)
            if c is inc or c in cands:
                continue
            why = (rule(t) if rule else None) or "; ".join(self.lab.check(t))
            if why:
                self._prune(c, why)
            else:
                cands.append(c)
        if not inc.runs and len(cands) == 1:
            return  # nothing to compare with: measure nothing
        self.race(cands)

    def stage_precision(self) -> None:
        def rule(t):
            if t.precision == "tf32" and self.env.device_type != "cuda":
                return "the same run as fp32 here: " + TF32_ON_CPU
            return None
        self._try([{"precision": p} for p in self._allowed("precision", registry.PRECISIONS)], rule)

    def stage_attention(self) -> None:
        if not self.env.can_set_attention:
            self.notes.append(f"attention not searched: {self.env.model} has no attention switch")
            return

        def rule(t):
            if t.attention == "flash" and not self.env.flash_installed:
                return "flash-attn is not installed here (pip install flash-attn, on CUDA)"
            return None
        self._try([{"attention": a} for a in self._allowed("attention", registry.ATTENTIONS)], rule)

    def stage_optimizer(self) -> None:
        algo = registry.optimizer(self.start.optimizer).factory
        same = [n for n in registry.LAB_OPTIMIZERS if registry.OPTIMIZERS[n].factory == algo]
        self._try([{"optimizer": o} for o in self._allowed("optimizer", same)])

    def sizes(self, low: int, high: int) -> list[int]:
        """Micro-batches in [low, high] to try: powers of two and ``high`` itself; with
        ``keep_global_batch`` the divisors of the global batch."""
        if high < low:
            return []
        if self.keep_global:
            out = [b for b in range(low, high + 1) if self.global_batch % b == 0]
        else:
            out = [2 ** k for k in range(high.bit_length()) if low <= 2 ** k <= high] + [high]
        out = sorted(set(out))
        wanted = self.space.get("micro_batch")
        return [b for b in out if wanted is None or b in wanted]

    def with_batch(self, b: int, **changes) -> dict:
        ga = self.global_batch // b if self.keep_global else self.incumbent.toggles.grad_accum
        return {"micro_batch": b, "grad_accum": ga, **changes}

    def stage_micro_batch(self) -> None:
        inc = self.incumbent.toggles
        if inc.checkpointing:  # the incumbent's own setting is the one "without" here
            self.notes.append("the starting toggles checkpoint: the micro-batch search keeps it on")
        if self.elapsed() >= self.budget_s:
            raise _Stop  # the max-batch search trains real steps too
        fit = self.trials.max_batch(inc, self.limit) or 0
        self.notes.append(f"largest micro-batch that fits with {label(inc, self.start)}: {fit} "
                          f"(searched up to {self.limit})")
        changes = [self.with_batch(b) for b in self.sizes(1, min(fit, self.limit))]
        for b in self.sizes(fit + 1, self.limit):
            self._prune(self._candidate(self.stage, inc.replace(**self.with_batch(b))),
                        f"does not fit (the largest micro-batch that fits is {fit})", fits=False)
        ckpt_allowed = True in self._allowed("checkpointing", [True])
        if not inc.checkpointing and ckpt_allowed:
            changes += self._checkpointing_sizes(inc, fit)
        self._try(changes)

    def _checkpointing_sizes(self, inc: Toggles, fit: int) -> list[dict]:
        probe = self._candidate(self.stage, inc.replace(**self.with_batch(max(fit, 1)), checkpointing=True))
        if fit >= self.limit:
            self._prune(probe, f"memory is not the limit: micro-batch {self.limit} (the largest "
                        "searched) fits without checkpointing, and checkpointing only pays "
                        "through a bigger batch")
            return []
        problems = self.lab.check(inc.replace(checkpointing=True))
        if problems:
            self._prune(probe, "; ".join(problems))
            return []
        if self.elapsed() >= self.budget_s:
            raise _Stop
        fit_ckpt = self.trials.max_batch(inc.replace(checkpointing=True), self.limit) or 0
        self.notes.append(f"largest micro-batch that fits with checkpointing: {fit_ckpt}")
        bigger = self.sizes(fit + 1, min(fit_ckpt, self.limit))
        if not bigger:
            self._prune(probe, f"lets no bigger micro-batch fit ({fit_ckpt} vs {fit} without)")
            return []
        if probe.toggles.micro_batch not in bigger:
            self._prune(probe, f"micro-batch {probe.toggles.micro_batch} fits without checkpointing: "
                        "recomputation would only cost time there")
        return [self.with_batch(b, checkpointing=True) for b in bigger]

    def stage_final(self) -> None:
        """The winner against the two best other candidates of all stages, to ``repeats + 2``
        repeats each: a stage decided while a burst of load slowed one side is decided again.
        Running out of budget here ends this race, not the search."""
        others = sorted((c for c in self.order if c.runs and c is not self.incumbent and c.status != "failed"),
                        key=lambda c: c.score, reverse=True)[:2]
        if not others:
            return
        for c in others:
            c.status = "racing"
        repeats, self.repeats = self.repeats, self.repeats + 2
        try:
            self.race([self.incumbent, *others])
        except _Stop:
            self.notes.append("the final race was cut short by the budget")
            for c in others:
                if c.status == "racing":
                    c.status, c.why = "kept", "still racing in the final when the budget ran out"
        finally:
            self.repeats = repeats

    def stage_compile(self) -> None:
        if True not in self._allowed("compile", [True]) or self.incumbent.toggles.compile:
            return
        c = self._candidate(self.stage, self.incumbent.toggles.replace(compile=True))
        left = self.budget_s - self.elapsed()
        if left < self.compile_s:
            self._prune(c, f"{left:.0f} s of budget left, compile_s={self.compile_s:g} s needed "
                        "(a first torch.compile costs tens of seconds)")
            return
        self._try([{"compile": True}])

    def _top_two(self) -> None:
        measured = sorted((c for c in self.order if c.runs and c.status != "failed"),
                          key=lambda c: c.score, reverse=True)
        win = self.incumbent
        others = [c for c in measured if c is not win]
        self.tied = self.unseparated()
        for c in self.tied:
            c.status = "tied"
            c.why = (f"{c.score / win.score:.2f}x the winner's tokens/s: "
                     + (_BUSY_WHY if c.busy or win.busy else
                        f"the noise band ±{self.band_of(win, c):.0%} cannot tell them apart"))
        if win.runs and others:
            second = others[0]
            self.band = self.band_of(win, second)
            self.within_noise = not self.beats(win, second) and not self.beats(second, win)
            self.runner_up = second.toggles if self.within_noise else None
            if self.beats(second, win):
                self.notes.append(f"{label(second.toggles, self.start)} measured faster than the winner "
                                  f"({second.score / win.score:.2f}x) but did not win its race: the search "
                                  "stopped first, or it was measured under other toggles' load")


def _finish(lab, search: _Search, snap: Snapshot, status: str, keep: str) -> AutotuneResult:
    """Weights back as before the search; the winner or the start applied; the result built."""
    if status != "complete":
        search._top_two()
        undone = [s for s in STAGES if s not in search.done]
        search.notes.append(f"stages not finished: {', '.join(undone)}")
        for c in search.order:
            if c.status == "waiting":
                c.status, c.why = "not run", f"the search stopped ({status}) before this trial"
            elif c.status == "racing":
                c.status, c.why = "kept", f"still racing when the search stopped ({status})"
    win = search.incumbent if search.incumbent.runs else None
    if win is not None:
        win.status = "winner"
    final = win.toggles if (win is not None and keep == "winner") else search.start
    same_optimizer = final.optimizer == search.start.optimizer
    if not same_optimizer:
        snap.optimizer = None  # another optimizer's state cannot be loaded into this one
    # a fresh optimizer (the trials' steps filled the state of the one they used), then the
    # state from before the search when it is the same optimizer
    lab.optimizer = None  # the next apply builds a fresh one
    lab.apply(final)
    snap.restore()
    if keep == "winner" and win is not None:
        lab.defaults = final
        state = "winner applied (lab.defaults); weights restored as before the search"
    else:
        state = "start restored; weights restored as before the search"
    if not same_optimizer:
        state += f"; optimizer {final.optimizer} starts with empty state"
    run = None
    if win is not None:
        target = win.score
        run = min(win.judged(), key=lambda r: abs(r.tokens_per_step / r.step_s_min - target))
    result = AutotuneResult(
        toggles=win.toggles if win else None, run=run, candidates=list(search.order),
        within_noise=search.within_noise, runner_up=search.runner_up, band=search.band,
        elapsed_s=search.elapsed(), budget_s=search.budget_s, status=status, state=state,
        start=search.start, notes=search.notes, close_calls=search.close_calls,
        tied=[c.toggles for c in search.tied], busy=[label(c.toggles, search.start) for c in search.order if c.busy])
    lab.last_autotune = result
    return result
