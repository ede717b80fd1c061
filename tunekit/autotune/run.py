"""The search on a Lab (`autotune`, through ``lab.autotune``), its trials (`LabTrials`) and how it
ends (`finish`).

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
on a shared machine only ever adds time (the reading of ``tunekit.lab.repeat_agreement``). A
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

import time

from tunekit.autotune import stages
from tunekit.autotune.options import AutotuneOptions
from tunekit.autotune.result import AutotuneResult
from tunekit.autotune.search import Search, Stop, TrialFailed
from tunekit.core import toggles as tg
from tunekit.core.toggles import ToggleError, Toggles, label, normalized
from tunekit.core.validate import is_whole
from tunekit.measure.interrupts import deferred_interrupt
from tunekit.train.guard import NonFiniteRunError, Snapshot


class LabTrials:
    """Runs the search's trials on a Lab: ``measure`` is one ``lab.run`` (so every trial is in
    ``lab.results()``), ``max_batch`` the Lab's max-batch search. Tests pass an object with the
    same three methods to inject measurements. A max-batch search gets what is left of
    ``budget_s`` (counted from when this is made) as its own ``budget_s``."""

    def __init__(self, lab, warmup: int, memory_budget_bytes=None, budget_s: float | None = None):
        self.lab, self.warmup = lab, warmup
        self.memory_budget_bytes = memory_budget_bytes
        self.deadline = None if budget_s is None else self.clock() + budget_s
        self.last_search = None  # the latest max-batch search (MaxBatchResult)

    def measure(self, t: Toggles, steps: int):
        try:
            return self.lab.run(steps=steps, warmup=self.warmup, verbose=False, **t.asdict())  # autotune shows its own
        except NonFiniteRunError as e:  # recorded and undone by the Lab: this candidate is out
            raise TrialFailed(str(e)) from e

    def max_batch(self, t: Toggles, limit: int) -> int | None:
        # the search's first trial always runs: a budget all but spent still gives one
        left = None if self.deadline is None else max(self.deadline - self.clock(), 1e-3)
        found = self.lab.find_max_batch_size(start=1, limit=limit, memory_budget_bytes=self.memory_budget_bytes,
                                             budget_s=left, verbose=False,  # autotune shows its own
                                             **t.replace(micro_batch=1).asdict())
        self.last_search = found  # why it stopped, for the stage's note
        return found.best

    def clock(self) -> float:
        return time.perf_counter()


def autotune(lab, budget_s: float = 60.0, objective: str = "tokens_per_s", *, keep_global_batch=False,
             max_micro_batch=None, steps: int = 3, warmup: int = 1, repeats: int = 3, noise: float = 0.03,
             memory_budget_bytes=None, space: dict | None = None, keep: str = "winner",
             compile_s: float = 60.0, trial_s: float = 0.25, progress=None, trials=None, on=None,
             setting=None) -> AutotuneResult:
    """Search the fastest legal configuration from ``lab``'s current toggles (``setting``: from
    this `tunekit.Setting`'s, one process; ``lab.setting_of(setting)``); see the module doc.

    ``budget_s``: seconds for the whole search. ``max_micro_batch``: the largest micro-batch tried
    (default: the global batch with ``keep_global_batch``, else 8x the starting micro-batch).
    ``steps``/``warmup``: per trial (one ``lab.run``), ``steps`` at least: once a step time is
    known, a trial runs enough steps to fill ``trial_s`` (up to 10x ``steps``) so that a fast
    configuration gets many chances of an undisturbed step; ``repeats``: measurements the
    finalists of a stage get; ``noise``: the smallest relative difference taken as real. ``space``: restrict a
    toggle's values, e.g. ``{"precision": ["fp32", "bf16"], "compile": [False]}``. ``compile_s``:
    budget left that the compile stage needs to start. ``progress(elapsed_s, budget_s, text)``
    is called before each trial. ``trials``: an object like ``LabTrials`` (tests inject one).
    ``on``: a cluster target (``tunekit.Slurm(...)``): each trial is a job, the independent trials
    of a round at once, at most ``on.max_jobs`` queued (``trials``: a
    ``tunekit.lab.cluster.ClusterTrials``, which ``lab.autotune(on=...)`` makes).
    The options and their checks are `AutotuneOptions`; this signature mirrors it.
    """
    o, errors = AutotuneOptions(
        budget_s, objective, keep_global_batch=keep_global_batch, max_micro_batch=max_micro_batch, steps=steps,
        warmup=warmup, repeats=repeats, noise=noise, memory_budget_bytes=memory_budget_bytes, space=space,
        keep=keep, compile_s=compile_s, trial_s=trial_s, progress=progress, trials=trials, on=on).checked()
    s = lab.setting_of(setting)   # the one Setting of the call (tunekit.lab.setting)
    if s.parallel is not None:
        errors.append(f"parallel={s.parallel!r}: autotune searches one process; run the ranks with lab.run(setting=s).")
    start = s.toggles
    errors += [f"the starting toggles cannot run: {p}" for p in lab.check(start, o.steps if is_whole(o.steps) else 1)]
    if o.on is not None and o.trials is None:
        errors.append("on= runs through lab.autotune(on=...), which makes the trials jobs (tunekit.lab.cluster)")
    if o.on is not None and hasattr(o.on, "check") and hasattr(o.on, "max_jobs"):
        errors += o.on.check()   # what the cluster refuses, with the rest, before anything is submitted
    if errors:
        raise ToggleError(errors)
    start = normalized(start)
    search = Search(lab, o.trials or LabTrials(lab, o.warmup, o.memory_budget_bytes, o.budget_s), start, o)
    snap = Snapshot.take(lab)
    status = "complete"
    try:
        stages.run(search)
    except Stop:
        status = "budget"
    except KeyboardInterrupt:
        status = "interrupted"
        with deferred_interrupt():
            result = finish(lab, search, snap, status, o.keep)
        raise
    finally:
        if status != "interrupted":
            result = finish(lab, search, snap, status, o.keep)
    return result


def finish(lab, search: Search, snap: Snapshot, status: str, keep: str) -> AutotuneResult:
    """Weights back as before the search; the winner or the start applied; the result built."""
    if status != "complete":
        search.top_two()
        undone = [s for s, _ in tg.search_stages() if s not in search.done]
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
    lab.reset_optimizer()
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
