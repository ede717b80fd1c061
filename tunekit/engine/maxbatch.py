"""The largest micro-batch that fits: double until it does not, then bisect. Engine layer.

    >>> found = lab.find_max_batch_size(precision="bf16")      # same toggles as lab.run
    >>> found.best, found.table()                                 # the answer and every trial

A trial is one real training step (forward, backward, optimizer step) at that micro-batch, so the
optimizer state and gradients are part of what must fit. "Does not fit" means:
- CUDA: ``torch.cuda.OutOfMemoryError`` (or a peak above ``memory_budget_bytes`` when given);
- CPU: the process' peak RSS rose more than ``memory_budget_bytes`` above where it stood before
  the search (default: half of the RAM available then). A trial whose size, extrapolated from the
  previous trials, would exceed 1.25x the budget is not run at all: a real CPU OOM kills the kernel.
Nor is a trial predicted to need more than the memory available when the search starts
(tunekit.measure.memavail: RAM within the process' cgroup, or the GPU's free memory), whatever
the budget; a first trial above micro-batch 4 is predicted by tunekit.engine.fit.
After every trial the memory is freed (gc, CUDA cache or glibc heap) so the process returns to
its baseline; ``after_bytes`` vs ``baseline_bytes`` shows that it did.
On CUDA the allocator's history is recorded during the search (``snapshot_on_oom``), and a trial
that runs out of memory leaves a snapshot (``trial.snapshot``, under ``core.paths.traces_dir()``) to
open in https://pytorch.org/memory_viz: what was alive, and allocated where, when it failed.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

from ..core import validate
from ..core.toggles import ToggleError, normalized
from ..core.validate import is_whole
from ..measure import memavail
from ..measure.device import now_s
from ..measure.interrupts import deferred_interrupt
from ..measure.meters import DeviceMeter
from ..measure.oom import drop_frames, free_memory, is_oom, memory_now_bytes
from ..measure.torch_private import cuda_memory_history
from ..measure.trace import prune_snapshots, save_snapshot
from . import fit

_PREDICT_MARGIN = 1.25


@dataclass
class Trial:
    micro_batch: int
    fits: bool
    used_bytes: float | None   # peak above the baseline (None when not run)
    reason: str                # "ok" | "OOM" | "over budget" | "over available" | "predicted over ..."
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

    def table(self):
        import pandas as pd
        return pd.DataFrame([t.__dict__ for t in self.trials])

    def __repr__(self):
        tried = ", ".join(f"{t.micro_batch}{'✓' if t.fits else '✗'}" for t in self.trials)
        return f"MaxBatchResult(best={self.best}, trials=[{tried}])"


def default_cpu_budget_bytes(fraction: float = 0.5) -> int:
    return int(memavail.cpu_available().bytes * fraction)


def find_max_batch_size(lab, start: int = 1, limit: int = 1024, memory_budget_bytes=None,
                        budget_fraction: float = 0.5, progress=None, snapshot_on_oom: bool = True,
                        **changes) -> MaxBatchResult:
    """Search the largest micro-batch in ``[start, limit]`` for ``lab``'s toggles plus ``changes``.

    ``progress(trial)`` is called after each trial. Example:
    ``lab.find_max_batch_size(memory_budget_bytes=2**30)`` on CPU: at most 1 GiB above baseline.
    Ctrl-C stops it: no gradients are left and its memory is freed, also what its traceback holds.
    """
    # Ctrl-C waits while the search sets up and cleans up: only the trials' steps run in the gate
    with deferred_interrupt() as shield:
        return _find(lab, shield, start, limit, memory_budget_bytes, budget_fraction, progress, snapshot_on_oom,
                     changes)


def _find(lab, shield, start, limit, memory_budget_bytes, budget_fraction, progress, snapshot_on_oom,
          changes) -> MaxBatchResult:
    t = lab.resolve(**changes)
    errors = []
    if not (is_whole(start) and is_whole(limit)) or not 1 <= start <= limit:
        errors.append(f"need whole numbers 1 <= start <= limit, got start={start!r}, limit={limit!r}")
    budget = validate.collect(errors, validate.memory_budget_bytes, "memory_budget_bytes", memory_budget_bytes)
    validate.collect(errors, validate.real, "budget_fraction", budget_fraction, 0, 1,
                     what="a number in (0, 1] (a share of the available RAM)")
    validate.collect(errors, validate.flag, "snapshot_on_oom", snapshot_on_oom)
    errors += lab.check(t.replace(micro_batch=start if is_whole(start) else 1))
    if errors:
        raise ToggleError(errors)
    start, limit, t = int(start), int(limit), normalized(t)
    dev = lab.device
    notes = []
    lab.apply(t, notes)
    if budget is None and dev.type == "cpu":
        budget = default_cpu_budget_bytes(budget_fraction)
        notes.append(f"CPU budget: {budget_fraction:.0%} of available RAM")
    free_memory(dev)
    baseline = memory_now_bytes(dev)
    avail = memavail.available(dev, lab.cuda_index)
    if avail is not None and budget is not None and budget > avail.bytes:
        notes.append(f"the budget is above the memory available ({avail.bytes} B, {avail.source}): "
                     "no trial predicted beyond that is run")
    result = MaxBatchResult(best=None, budget_bytes=budget, baseline_bytes=baseline,
                            available_bytes=None if avail is None else avail.bytes,
                            device=str(dev), notes=notes)

    history = snapshot_on_oom and dev.type == "cuda"
    if snapshot_on_oom and not history:
        notes.append(f"no allocator snapshot on {dev.type}: torch.cuda.memory snapshots are CUDA only")

    def attempt(b: int) -> bool:
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
        _search(attempt, start, limit, result)
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


def _search(attempt, start: int, limit: int, result) -> None:
    """Double from ``start`` until a trial does not fit, then bisect; sets ``result.best``."""
    good, bad, b = 0, None, start
    while True:  # doubling
        if attempt(b):
            good = b
            if b >= limit:
                break
            b = min(2 * b, limit)
        else:
            bad = b
            break
    while bad is not None and bad - good > 1:  # bisect between the last fit and the first miss
        mid = (good + bad) // 2
        if attempt(mid):
            good = mid
        else:
            bad = mid
    result.best = good or None


def _predict_used(b: int, trials: list) -> float | None:
    # used ~ fixed + b * per_sample: fit the two nearest measured trials (one: proportional)
    ok = sorted((t.micro_batch, t.used_bytes) for t in trials
                if t.used_bytes is not None and t.used_bytes > 0)
    if not ok:
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
    if predicted is None and t.micro_batch > 4:   # a first trial far up: estimated, not guessed
        predicted = fit.estimate(lab, t).need_bytes
    # no margin here: past the available memory a CPU trial is not refused, the kernel kills
    if predicted is not None and available is not None and predicted > available:
        return Trial(t.micro_batch, False, None, "predicted over available", 0.0)
    if predicted is not None and budget is not None and predicted > _PREDICT_MARGIN * budget:
        return Trial(t.micro_batch, False, None, "predicted over budget", 0.0)
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
        return Trial(t.micro_batch, False, used, f"OOM: {oom_text}", seconds, snapshot)
    if available is not None and used is not None and used > available:
        return Trial(t.micro_batch, False, used, "over available", seconds)  # survived, by luck
    if budget is not None and used is not None and used > budget:
        return Trial(t.micro_batch, False, used, "over budget", seconds)
    return Trial(t.micro_batch, True, used, "ok", seconds)


def _snapshot(micro_batch: int) -> str | None:
    """Dump the allocator history of the trial that ran out of memory (None if that fails too)."""
    try:
        return save_snapshot(f"oom-mb{micro_batch}")[0]
    except Exception:  # a full disk must not turn an OOM trial into a failed search
        return None
