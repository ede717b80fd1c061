"""The autotune search's racing machinery: trials within the budget, the noise band, successive
halving, the tiebreak and the final judgement of the top two; the stages that
pick the candidates are in `stages`, the module doc of ``tunekit.autotune.run`` says why.
"""
from __future__ import annotations

import math

from tunekit.autotune.options import AutotuneOptions
from tunekit.autotune.result import BUSY_RETRIES, Candidate, measured_busy
from tunekit.core import noise
from tunekit.core import toggles as tg
from tunekit.core.fmt import fmt_pct, fmt_rate
from tunekit.core.notes import Note
from tunekit.core.run_text import unit_of
from tunekit.core.toggles import ToggleError, Toggles, label
from tunekit.core.units import is_missing
from tunekit.measure.oom import is_oom

TIEBREAK_ROUNDS = 2    # x repeats: the most extra repeats inseparable top candidates get
BUSY_WHY = "measured on a busy machine in every trial, so not judged"


class Stop(Exception):
    """The budget does not allow the next trial."""


class TrialFailed(Exception):
    """A trial that ran and failed for the reason its message gives (a run gone non-finite):
    raised by the trial runner, the candidate is out."""


def timed_steps(step_s: float, steps: int, trial_s: float) -> int:
    """Timed steps filling ``trial_s`` at ``step_s`` per step, within [steps, 10 x steps]
    (``steps`` when ``step_s`` is unknown: 0 or NaN)."""
    if not step_s > 0:
        return steps
    return max(steps, min(10 * steps, math.ceil(trial_s / step_s)))


class Search:
    """The state of one search: the candidates in the order considered, the incumbent (the
    winner so far), notes, and what the top two came to (`top_two`)."""

    def __init__(self, lab, trials, start: Toggles, o: AutotuneOptions):
        self.lab, self.trials, self.start, self.budget_s = lab, trials, start, o.budget_s
        self.keep_global = o.keep_global_batch
        self.global_batch = start.micro_batch * start.grad_accum
        default_limit = self.global_batch if o.keep_global_batch else 8 * start.micro_batch
        self.limit = o.max_micro_batch if o.max_micro_batch is not None else default_limit
        if o.keep_global_batch:
            self.limit = min(self.limit, self.global_batch)
        self.steps, self.trial_s = o.steps, o.trial_s
        self.repeats, self.noise, self.space = o.repeats, o.noise, dict(o.space or {})
        self.compile_s, self.progress = o.compile_s, o.progress
        self.env = lab.env()
        self.by_key: dict[tuple, Candidate] = {}
        self.order: list[Candidate] = []
        self.notes: list[str] = []
        self.close_calls: list[str] = []  # stage decisions whose finalists were within noise
        self.done: list[str] = []
        self.stage = ""
        self.n_trials = 0   # trials started, for the display
        self.t0 = trials.clock()
        self.incumbent = self.candidate("start", start)
        self.incumbent.why = "the starting configuration"
        self.within_noise, self.runner_up, self.band = False, None, o.noise
        self.tied: list[Candidate] = []  # top candidates the band cannot separate from the winner

    # --- bookkeeping -----------------------------------------------------------------------

    def elapsed(self) -> float:
        return self.trials.clock() - self.t0

    def candidate(self, stage, t: Toggles) -> Candidate:
        """The candidate of ``t``: the one already considered, or a new one of ``stage``."""
        key = tuple(t.asdict().values())
        if key not in self.by_key:
            self.by_key[key] = c = Candidate(stage, t)
            self.order.append(c)
        return self.by_key[key]

    def allowed(self, name, values) -> list:
        """``values`` of toggle ``name`` that the ``space`` option allows."""
        wanted = self.space.get(name)
        return [v for v in values if wanted is None or v in wanted]

    def prune(self, c: Candidate, why: str, fits=None) -> None:
        if c.status == "waiting":
            c.status, c.why, c.fits = "pruned", why, fits


    # --- one trial ------------------------------------------------------------------------

    def _predicted_s(self, c: Candidate, per_step: bool = False) -> float:
        """What ``c``'s trial will cost in training steps (warm-up and timed), scaled from the
        fastest run so far of its precision by the samples per step; 0 with nothing to go by.
        A first run's FLOP count and peak calibration are one-off costs and left out; what every
        trial costs besides its steps (a cluster job's queue and start: the trials object's
        ``overhead_s``, 0 for a Lab's) is added."""
        size = c.toggles.micro_batch * c.toggles.grad_accum
        seen = [(1 if per_step else r.steps + r.warmup) * r.step_s * size
                / (o.toggles.micro_batch * o.toggles.grad_accum)
                for o in self.order if o.toggles.precision == c.toggles.precision
                and o.toggles.compile == c.toggles.compile for r in o.runs]
        if per_step:
            return min(seen, default=0.0)
        return min(seen, default=0.0) + getattr(self.trials, "overhead_s", 0.0)

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
            raise Stop
        for attempt in range(1 + BUSY_RETRIES):
            if not self.trial(c, attempt):
                return False
            if not measured_busy(c.runs[-1]) or attempt == BUSY_RETRIES or not self.fits_budget(c):
                break
        c.repeats += 1
        return True

    def measure_all(self, cands: list[Candidate], stop_on_fail: bool = False) -> list[bool]:
        """One more repeat of each of ``cands`` (independent trials: a round of a race, a pair
        settled, a tiebreak round); whether each went well, in order. One at a time through
        `measure` (``stop_on_fail``: none after the first that failed), unless the trials object
        has ``measure_many`` (a cluster's: the trials run as jobs at once, up to its ``max_jobs``),
        then all that fit the budget together, each measured busy again as `measure` does; Stop
        after them when the budget did not allow them all."""
        many = getattr(self.trials, "measure_many", None)
        if many is None or len(cands) < 2:
            out = []
            for c in cands:
                out.append(self.measure(c))
                if stop_on_fail and not out[-1]:
                    break
            return out
        go = []
        for c in cands:
            if not self.fits_budget(c):
                break
            go.append(c)
        if not go:
            raise Stop
        ok, todo, attempt = [True] * len(go), list(range(len(go))), 0
        while todo:
            for i in todo:
                self._announce(go[i], attempt)
            outcomes = many([(go[i].toggles, self.steps_for(go[i])) for i in todo])
            again = []
            for i, (outcome, seconds) in zip(todo, outcomes):
                c = go[i]
                if not self._record(c, outcome, seconds):
                    ok[i] = False
                elif measured_busy(c.runs[-1]) and attempt < BUSY_RETRIES and self.fits_budget(c):
                    again.append(i)
            todo, attempt = again, attempt + 1
        for c, good in zip(go, ok):
            if good:
                c.repeats += 1
        if len(go) < len(cands):
            raise Stop
        return ok

    def _announce(self, c: Candidate, attempt: int) -> None:
        self.n_trials += 1
        if self.progress is not None:
            self.progress(self.elapsed(), self.budget_s, self.trial_text(c, attempt))

    def trial(self, c: Candidate, attempt: int) -> bool:
        """One ``lab.run`` of ``c``, added to its runs; False when it failed."""
        self._announce(c, attempt)
        t0 = self.trials.clock()
        try:
            outcome = self.trials.measure(c.toggles, self.steps_for(c))
        except Exception as e:  # noqa: BLE001 - one failed candidate must not end the search
            outcome = e
        except BaseException:
            c.seconds += self.trials.clock() - t0
            raise
        return self._record(c, outcome, self.trials.clock() - t0)

    def _record(self, c: Candidate, outcome, seconds: float) -> bool:
        """A trial's outcome (its RunResult, or the exception it raised) in ``c``; False when it failed."""
        c.seconds += seconds
        if isinstance(outcome, ToggleError):
            c.status, c.why = "pruned", "; ".join(outcome.problems)
            return False
        if isinstance(outcome, TrialFailed):
            c.status, c.why = "failed", str(outcome)
            return False
        if isinstance(outcome, Exception):
            if is_oom(outcome):
                c.status, c.why, c.fits = "failed", "out of memory", False
            else:
                text = str(outcome)
                c.status, c.why = "failed", f"{type(outcome).__name__}: {text.splitlines()[0][:200] if text else ''}"
            return False
        c.runs.append(outcome)
        c.fits = True
        return True

    def trial_text(self, c: Candidate, attempt: int) -> str:
        """What the trial starting now is, for a display: 'stage 1/6 precision · trial 5: bf16
        (repeat 1) · best 41,200 tokens/s' (the incumbent's best, once measured)."""
        names = [name for name, _ in tg.search_stages()]
        stage = f"stage {names.index(self.stage) + 1}/{len(names)} {self.stage}" if self.stage in names \
            else self.stage
        again = ", measured again: the machine was busy" if attempt else ""
        text = f"{stage} · trial {self.n_trials}: {label(c.toggles, self.start)} (repeat {c.repeats + 1}{again})"
        best = self.incumbent.score if self.incumbent.runs else math.nan
        if not is_missing(best):
            text += f" · best {fmt_rate(best, unit_of(self.incumbent.runs[-1]) + '/s')}"
        return text

    # --- comparing --------------------------------------------------------------------------

    def band_of(self, a: Candidate, b: Candidate) -> float:
        """How far apart two scores must be to count: ``noise`` or, when larger, how far the two
        fastest repeats of either candidate disagree (``core.noise.band``)."""
        return noise.band([[r.step_s_min for r in c.best_runs()] for c in (a, b)], self.noise)

    def beats(self, a: Candidate, b: Candidate) -> bool:
        """``a`` is faster than ``b`` beyond the noise band, both measured on a quiet machine
        (figures from busy trials decide nothing)."""
        return not (a.busy or b.busy) and noise.word(a.score / b.score, self.band_of(a, b)) == "helped"

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
            todo = [c for c in alive if c.repeats < rnd]
            for c, ok in zip(todo, self.measure_all(todo)):
                if not ok:
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
                             f"±{fmt_pct(self.band_of(leader, c), 0)}")
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
                                            + (BUSY_WHY if best.busy or inc.busy else
                                               f"within the noise band ±{fmt_pct(self.band_of(best, inc), 0)}")
                                            + ", so the incumbent stays")
            best = inc
        if best is not inc and inc in alive:
            inc.status, inc.why = "dropped", (f"beaten beyond noise by {label(best.toggles, self.start)} "
                                              f"({best.score / inc.score:.2f}x, "
                                              f"band ±{fmt_pct(self.band_of(best, inc), 0)})")
        for c in alive:
            if c is not best and c.status == "racing":
                c.status, c.why = "kept", (f"finalist: {c.score / best.score:.2f}x the stage winner, "
                                           + (BUSY_WHY if c.busy or best.busy else "not apart beyond noise"))
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
                oks = self.measure_all([inc, best], stop_on_fail=True)
                if not all(oks):
                    for c, ok in zip((inc, best), oks):
                        if not ok:
                            alive.remove(c)
                    return
            except Stop:
                return  # the budget is spent: decide on what was measured

    # --- the end ----------------------------------------------------------------------------

    def unseparated(self) -> list[Candidate]:
        """The two best measured candidates the winner does not hold against (`holds`)."""
        win = self.incumbent
        out = [c for c in self.order if c is not win and c.runs and c.status != "failed" and not self.holds(win, c)]
        return sorted(out, key=lambda c: c.score, reverse=True)[:2] if win.runs else []

    def tiebreak(self) -> None:
        """Top candidates the noise band cannot separate from the winner get the rest of the
        budget: alternating repeats of the winner and them (at most ``TIEBREAK_ROUNDS x repeats``
        rounds); one that then beats the winner beyond the band wins, one the winner beats drops.
        Those still inseparable make the result inconclusive (`top_two`)."""
        self.stage = "tiebreak"
        for _ in range(TIEBREAK_ROUNDS * self.repeats):
            top = self.unseparated()
            if not top:
                return
            try:
                if not all(self.measure_all([self.incumbent, *top], stop_on_fail=True)):
                    return
            except Stop:
                self.notes.append("the tiebreak between the top candidates ran until the budget was spent")
                return
            win = self.incumbent
            best = max(top, key=lambda c: c.score)
            if self.beats(best, win):
                win.status, win.why = "dropped", (
                    f"tiebreak: beaten beyond noise by {label(best.toggles, self.start)} "
                    f"({best.score / win.score:.2f}x, band ±{fmt_pct(self.band_of(best, win), 0)})")
                best.status, best.why, self.incumbent = "winner", "won the tiebreak against the previous winner", best
            for c in top:
                if c is not self.incumbent and self.beats(self.incumbent, c):
                    c.status, c.why = "dropped", (f"tiebreak: {c.score / self.incumbent.score:.2f}x the winner's "
                                                  "tokens/s, beyond the band "
                                                  f"±{fmt_pct(self.band_of(self.incumbent, c), 0)}")

    def top_two(self) -> None:
        """Judge the winner against the rest: the candidates it does not hold against are
        ``tied``; the best other sets ``band``, ``within_noise`` and ``runner_up``."""
        measured = sorted((c for c in self.order if c.runs and c.status != "failed"),
                          key=lambda c: c.score, reverse=True)
        win = self.incumbent
        others = [c for c in measured if c is not win]
        self.tied = self.unseparated()
        for c in self.tied:
            c.status = "tied"
            c.why = (f"{c.score / win.score:.2f}x the winner's tokens/s: "
                     + (BUSY_WHY if c.busy or win.busy else
                        f"the noise band ±{fmt_pct(self.band_of(win, c), 0)} cannot tell them apart"))
        if win.runs and others:
            second = others[0]
            self.band = self.band_of(win, second)
            self.within_noise = not self.beats(win, second) and not self.beats(second, win)
            self.runner_up = second.toggles if self.within_noise else None
            if self.beats(second, win):
                self.notes.append(Note("autotune.unconfirmed", f"{label(second.toggles, self.start)} measured "
                                       f"faster than the winner ({second.score / win.score:.2f}x) but did not win "
                                       "its race: the search stopped first, or it was measured under other "
                                       "toggles' load"))

