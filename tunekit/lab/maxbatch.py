"""The largest micro-batch that fits: double until it does not, then bisect.

    >>> found = lab.find_max_batch_size(precision="bf16")      # same toggles as lab.run
    >>> found.best, found.table()                                 # the answer and every trial
    >>> found.stopped, found.verdict          # "converged" | "search limit" | "budget", in words

The search stops for one of three reasons (``found.stopped``): ``"converged"`` (a size fits and
the next one does not: the answer), ``"search limit"`` (``limit`` itself fits: the true maximum
may be higher, search again with a bigger ``limit``) or ``"budget"`` (the wall-clock ``budget_s``
would be passed by the next trial: ``best`` is the largest size that fit so far, ``too_big`` the
smallest that did not, and the maximum lies between them). The first trial always runs; before
each later one the search expects it to take as long as the last trial that ran, scaled up by the
ratio of their micro-batches when it is bigger, and does not start it if it would end past the
budget.

A trial is one real training step (forward, backward, optimizer step) at that micro-batch, so the
optimizer state and gradients are part of what must fit. "Does not fit" means:
- CUDA: ``torch.cuda.OutOfMemoryError`` (or a peak above ``memory_budget_bytes`` when given);
- CPU: the process' peak RSS rose more than ``memory_budget_bytes`` above where it stood before
  the search (default: half of the RAM available then). A trial whose size, extrapolated from the
  previous trials, would exceed 1.25x the budget is not run at all: a real CPU OOM kills the kernel.
Nor is a trial predicted to need more than the memory available when the search starts
(tunekit.measure.memavail: RAM within the process' cgroup, or the GPU's free memory), whatever
the budget; a first trial above micro-batch 4 is predicted by tunekit.lab.fit.
After every trial the memory is freed (gc, CUDA cache or glibc heap) so the process returns to
its baseline; ``after_bytes`` vs ``baseline_bytes`` shows that it did.
On CUDA the allocator's history is recorded during the search (``snapshot_on_oom``), and a trial
that runs out of memory leaves a snapshot (``trial.snapshot``, under ``core.paths.traces_dir()``) to
open in https://pytorch.org/memory_viz: what was alive, and allocated where, when it failed.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field

from tunekit.core import validate
from tunekit.core.fmt import fmt_pct
from tunekit.core.notes import Note, kind_of
from tunekit.core.search import largest_fitting
from tunekit.core.setting import Setting
from tunekit.core.toggles import ToggleError, normalized, toggle_keywords
from tunekit.core.validate import is_whole
from tunekit.lab import fit
from tunekit.lab.setting import setting_of
from tunekit.measure import memavail
from tunekit.measure.device import now_s
from tunekit.measure.device_meter import DeviceMeter
from tunekit.measure.interrupts import deferred_interrupt
from tunekit.measure.oom import drop_frames, free_memory, is_oom, memory_now_bytes
from tunekit.measure.torch_private import cuda_memory_history
from tunekit.measure.trace import prune_snapshots, save_snapshot

_PREDICT_MARGIN = 1.25
STOPS = ("converged", "search limit", "budget")
PREDICTED = ("trial.predicted_over_available", "trial.predicted_over_budget")  # trials not run
clock = time.perf_counter  # the budget's clock (wall time); tests put a fake one here


@dataclass
class Trial:
    micro_batch: int
    fits: bool
    used_bytes: float | None   # peak above the baseline (None when not run)
    reason: str                # a Note: "ok" | "OOM: ..." | "over budget" | ..., its kind trial.* (core.notes)
    seconds: float
    snapshot: str | None = None  # CUDA OOM: the allocator snapshot file (memory_viz)


@dataclass
class MaxBatchResult:
    best: int | None           # None: not even the first trial fit
    trials: list = field(default_factory=list)
    budget_bytes: float | None = None
    available_bytes: int | None = None   # memory available at the start (None: unknown here)
    baseline_bytes: int = 0
    after_bytes: int = 0
    device: str = ""
    notes: list = field(default_factory=list)
    stopped: str = ""          # why the search ended: one of STOPS
    too_big: int | None = None  # the smallest micro-batch that did not fit (None: none failed)
    limit: int | None = None    # the largest micro-batch the search would try
    budget_s: float | None = None  # the wall-clock budget (None: none)
    elapsed_s: float = 0.0     # wall time the trials took

    def table(self):
        """pandas DataFrame, one row per trial. Example: ``found.table()[["micro_batch", "fits"]]``."""
        import pandas as pd
        return pd.DataFrame([t.__dict__ for t in self.trials])

    @property
    def verdict(self) -> str:
        """The answer and why the search stopped, in words: ``print(found.verdict)``."""
        n = f"{len(self.trials)} trial{'s' if len(self.trials) != 1 else ''}, {self.elapsed_s:.1f} s"
        if self.stopped == "search limit":
            return (f"largest micro-batch that fits: {self.best}, the search limit (limit={self.limit}); "
                    f"the true maximum may be higher: search again with a bigger limit "
                    f"(e.g. limit={2 * self.limit}) ({n})")
        if self.stopped == "budget":
            bracket = (f"largest micro-batch that fit: {self.best}, smallest that did not: {self.too_big}; "
                       "the maximum is in between" if self.too_big is not None else
                       f"largest micro-batch that fit: {self.best}, none failed yet; the maximum is "
                       f"between {self.best} and the limit, {self.limit}")
            return (f"stopped by the time budget (budget_s={self.budget_s:g}): the next trial would have "
                    f"ended past it. The search is not finished: {bracket}. A bigger budget_s "
                    f"finishes it ({n})")
        if self.best is None:
            miss = next((t for t in reversed(self.trials) if t.micro_batch == self.too_big), None)
            why = f" ({miss.reason})" if miss is not None else ""
            return f"not even micro-batch {self.too_big} fits{why} ({n})"
        return f"largest micro-batch that fits: {self.best} ({self.too_big} does not; {n})"

    def __repr__(self):
        tried = ", ".join(f"{t.micro_batch}{'✓' if t.fits else '✗'}" for t in self.trials)
        return (f"MaxBatchResult(best={self.best}, stopped={self.stopped!r}, trials=[{tried}])\n"
                f"{self.verdict}")


def default_cpu_budget_bytes(fraction: float = 0.5) -> int:
    """Bytes the CPU search may use by default: ``fraction`` of the RAM available now.

    Example: ``default_cpu_budget_bytes(0.25)`` is a quarter of it."""
    return int(memavail.cpu_available().bytes * fraction)


@toggle_keywords
def find_max_batch_size(lab, start: int = 1, limit: int = 1024, memory_budget_bytes=None,
                        budget_fraction: float = 0.5, progress=None, snapshot_on_oom: bool = True,
                        budget_s: float | None = 60.0, trying=None, setting=None, **changes) -> MaxBatchResult:
    """Search the largest micro-batch in ``[start, limit]`` for ``lab``'s toggles plus ``changes``
    (any toggle, as for ``lab.run``).

    Example: ``lab.find_max_batch_size(memory_budget_bytes=2**30)`` on CPU: at most 1 GiB above
    baseline. ``budget_s``: wall-clock seconds for the whole search (default 60; None: no limit);
    the next trial is not started when it would end past it, and the result says so
    (``stopped == "budget"``) with the bracket found. ``limit`` is the largest size tried: when it
    fits, ``stopped == "search limit"`` and the true maximum may be higher.
    ``progress(trial)`` is called after each trial, ``trying(micro_batch)`` before each (a
    display's: ``lab.find_max_batch_size`` shows the search with it, tunekit.view.progress).
    Ctrl-C stops it: no gradients are left and its memory is freed, also what its traceback holds.
    ``setting``: a ``tunekit.Setting`` instead of the toggles (one process: no parallel layout).
    """
    s = setting_of(lab, setting, changes, one_process=True, api="find_max_batch_size")
    return search(lab, s, start, limit, memory_budget_bytes, budget_fraction, progress, snapshot_on_oom, budget_s,
                  trying)


def search(lab, s: Setting, start: int = 1, limit: int = 1024, memory_budget_bytes=None, budget_fraction: float = 0.5,
           progress=None, snapshot_on_oom: bool = True, budget_s: float | None = 60.0, trying=None) -> MaxBatchResult:
    """`find_max_batch_size` of the Setting ``s`` made at its caller's edge (its toggles; its
    micro-batch is the search's)."""
    # Ctrl-C waits while the search sets up and cleans up: only the trials' steps run in the gate
    with deferred_interrupt() as shield:
        return _find(lab, shield, start, limit, memory_budget_bytes, budget_fraction, progress, snapshot_on_oom,
                     budget_s, trying, s)


def _find(lab, shield, start, limit, memory_budget_bytes, budget_fraction, progress, snapshot_on_oom,
          budget_s, trying, s: Setting) -> MaxBatchResult:
    t = s.toggles
    errors = []
    if not (is_whole(start) and is_whole(limit)) or not 1 <= start <= limit:
        errors.append(f"need whole numbers 1 <= start <= limit, got start={start!r}, limit={limit!r}")
    budget_s = validate.collect(errors, validate.optional(validate.real), "budget_s", budget_s)
    budget = validate.collect(errors, validate.memory_budget_bytes, "memory_budget_bytes", memory_budget_bytes)
    validate.collect(errors, validate.real, "budget_fraction", budget_fraction, 0, 1,
                     what="a number in (0, 1] (a share of the available RAM)")
    validate.collect(errors, validate.flag, "snapshot_on_oom", snapshot_on_oom)
    validate.collect(errors, validate.optional_callable, "trying", trying,
                     "nothing (it is called with each micro_batch before its trial)")
    errors += lab.check(t.replace(micro_batch=start if is_whole(start) else 1))
    if errors:
        raise ToggleError(errors)
    start, limit, t = int(start), int(limit), normalized(t)
    dev = lab.device
    notes = []
    lab.apply(t, notes)
    if budget is None and dev.type == "cpu":
        budget = default_cpu_budget_bytes(budget_fraction)
        notes.append(f"CPU budget: {fmt_pct(budget_fraction, 0)} of available RAM")
    free_memory(dev)
    baseline = memory_now_bytes(dev)
    avail = memavail.available(dev, lab.cuda_index)
    if avail is not None and budget is not None and budget > avail.bytes:
        notes.append(f"the budget is above the memory available ({avail.bytes} B, {avail.source}): "
                     "no trial predicted beyond that is run")
    result = MaxBatchResult(best=None, budget_bytes=budget, baseline_bytes=baseline,
                            available_bytes=None if avail is None else avail.bytes,
                            device=str(dev), notes=notes, limit=limit, budget_s=budget_s)

    history = snapshot_on_oom and dev.type == "cuda"
    if snapshot_on_oom and not history:
        notes.append(f"no allocator snapshot on {dev.type}: torch.cuda.memory snapshots are CUDA only")

    def attempt(b: int) -> bool:
        if trying is not None:
            with shield.gate():
                trying(b)
        trial = _trial(lab, t.replace(micro_batch=b), baseline, budget, result.trials, history,
                       result.available_bytes, shield=shield)
        result.trials.append(trial)
        if progress is not None:
            with shield.gate():
                progress(trial)
        return trial.fits

    if history:
        cuda_memory_history(True)
    try:
        _search(attempt, start, limit, result, budget_s)
    except KeyboardInterrupt as e:  # the trial's tensors its traceback holds go too (kept as a note)
        drop_frames(e)
        raise
    finally:  # also after Ctrl-C or an error: no gradients left, memory back to the baseline
        if history:
            cuda_memory_history(False)
        lab.recover()
        free_memory(dev)
        result.after_bytes = memory_now_bytes(dev)
    if any(trial.snapshot for trial in result.trials):
        notes.extend(filter(None, [prune_snapshots()]))
    return result


def _search(attempt, start: int, limit: int, result, budget_s: float | None = None) -> None:
    """The one search (core.search) over trials, while the budget lasts; sets ``result.best``,
    ``too_big``, ``stopped`` and ``elapsed_s``. ``attempt(b)`` runs one trial (appending it to
    ``result.trials``) and says whether ``b`` fits; time is read from ``clock``."""
    t0, costs = clock(), []   # costs: (micro_batch, wall seconds) of the trials that ran

    def fits(b: int) -> bool | None:  # None: the budget cannot pay for the trial at b
        if costs and budget_s is not None:
            last_b, last_s = costs[-1]
            if clock() - t0 + last_s * max(1.0, b / last_b) > budget_s:
                return None
        before, n = clock(), len(result.trials)
        ok = attempt(b)
        if not result.trials[n:] or kind_of(result.trials[-1].reason) not in PREDICTED:
            costs.append((b, clock() - before))
        return ok

    found = largest_fitting(fits, start, limit)
    result.best, result.too_big = found.best, found.too_big
    result.stopped = "budget" if found.stopped == "stopped" else found.stopped
    result.elapsed_s = clock() - t0


def _predict_used(b: int, trials: list) -> float | None:
    # used ~ fixed + b * per_sample: fit the two nearest measured trials (one: proportional).
    # Never below the smallest measured size: memory grows with the micro-batch, so only a
    # measurement refuses a smaller one (a line through two noisy RSS peaks, drawn downward,
    # once refused micro-batch 1 after 29 had fit)
    ok = sorted((t.micro_batch, t.used_bytes) for t in trials
                if t.used_bytes is not None and t.used_bytes > 0)
    if not ok or b < ok[0][0]:
        return None
    if len(ok) == 1:
        return ok[0][1] * b / ok[0][0]
    (b1, u1), (b2, u2) = sorted(ok, key=lambda r: abs(r[0] - b))[:2]
    if b1 == b2:
        return u1 * b / b1
    slope = (u2 - u1) / (b2 - b1)
    return u2 + slope * (b - b2)


def _trial(lab, t, baseline: int, budget, trials, history: bool = False, available=None, *,
           shield=None) -> Trial:
    dev = lab.device
    predicted = _predict_used(t.micro_batch, trials)
    measured = any(x.used_bytes is not None for x in trials)
    if predicted is None and t.micro_batch > 4 and not measured:   # a first trial far up: estimated, not guessed
        predicted = fit.estimate(lab, t).need_bytes
    # no margin here: past the available memory a CPU trial is not refused, the kernel kills
    if predicted is not None and available is not None and predicted > available:
        return Trial(t.micro_batch, False, None,
                     Note("trial.predicted_over_available", "predicted over available"), 0.0)
    if predicted is not None and budget is not None and predicted > _PREDICT_MARGIN * budget:
        return Trial(t.micro_batch, False, None,
                     Note("trial.predicted_over_budget", "predicted over budget"), 0.0)
    # the core's meters, not a bare reset of torch's peak: an enclosing %%gpuprofile keeps its own
    meter = DeviceMeter(dev, lab.cuda_index).start()
    oom_text = snapshot = None
    t0 = now_s(dev)
    try:
        # the lab's (calibrated) scaler: a fresh one at 2**16 may skip the step as inf, and a
        # skipped step allocates no optimizer state, so the trial would look smaller than it is
        with shield.gate() if shield is not None else nullcontext():
            lab.train_step(t)
    except Exception as exc:  # decide outside the handler: its traceback pins the tensors
        lab.recover()  # an OOM can leave half-made gradients and a scaler mid-step
        if not is_oom(exc):
            raise
        oom_text = str(exc).splitlines()[0][:200]
        snapshot = _snapshot(t.micro_batch) if history else None
    finally:
        seconds = now_s(dev) - t0
        peak = meter.stop()
        used = None if peak is None else peak - baseline
    free_memory(dev)
    if oom_text is not None:
        return Trial(t.micro_batch, False, used, Note("trial.oom", f"OOM: {oom_text}"), seconds, snapshot)
    if available is not None and used is not None and used > available:
        # survived, by luck
        return Trial(t.micro_batch, False, used, Note("trial.over_available", "over available"), seconds)
    if budget is not None and used is not None and used > budget:
        return Trial(t.micro_batch, False, used, Note("trial.over_budget", "over budget"), seconds)
    return Trial(t.micro_batch, True, used, Note("trial.ok", "ok"), seconds)


def _snapshot(micro_batch: int) -> str | None:
    """Dump the allocator history of the trial that ran out of memory (None if that fails too)."""
    try:
        return save_snapshot(f"oom-mb{micro_batch}")[0]
    except Exception:  # a full disk must not turn an OOM trial into a failed search
        return None
