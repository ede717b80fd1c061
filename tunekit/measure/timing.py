"""The one timing helper: device-synchronized repeats, summarized by median/min/max.

Benchmarks, calibration, the Lab and the notebooks all time through `time_repeats`, so every
clock read in tunekit follows the same rule: synchronize the device, then read the clock.

    >>> tunekit.measure.median_s(lambda: a @ b, repeats=5, warmup=1)     # seconds, median of 5
    >>> tunekit.verdict(tunekit.measure.time_records(old, repeats=3), tunekit.measure.time_records(new, repeats=3))
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

from tunekit.core import noise
from tunekit.core.conditions import Conditions, combine, first_reason
from tunekit.core.fmt import fmt_pct
from tunekit.core.records import ProfileRecord
from tunekit.core.validate import real, whole
from tunekit.measure.conditions import ConditionsMeter
from tunekit.measure.device import cuda_device_index, device_label, existing_device, synchronize

NaN = math.nan


def time_repeats(fn, device=None, warmup: int = 1, repeats: int = 5, after_each=None) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn()`` after ``warmup`` untimed calls.

    The device is synchronized before each clock read (``device=None``: CUDA if this process
    initialized it). ``after_each(i, seconds)`` runs after call i, outside its clock.

    Example: ``tunekit.measure.time_repeats(lambda: model(x), repeats=7)``.
    """
    warmup, repeats = whole("warmup", warmup, 0), whole("repeats", repeats)
    if device is not None:
        device = existing_device(device)  # a device this machine lacks: a clear error, not torch's assertion
    for _ in range(warmup):
        fn()
    out = []
    for i in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        out.append(time.perf_counter() - t0)
        if after_each is not None:
            after_each(i, out[-1])
    return out


def time_records(fn, repeats: int = 5, warmup: int = 1, device=None, name: str = "repeat") -> list:
    """`time_repeats` with the machine's conditions: one ``ProfileRecord`` per repeat (``wall_s``,
    ``conditions``, ``device``), what `verdict` needs to set busy repeats aside. Lighter than
    ``tunekit.profile`` (no memory or FLOPs) and not added to ``history()``.

    Example: ``tunekit.verdict(tunekit.measure.time_records(old, 3), tunekit.measure.time_records(new, 3))``.
    """
    warmup, repeats = whole("warmup", warmup, 0), whole("repeats", repeats)
    if not callable(fn):
        raise ValueError(f"fn must be a function to time (got {type(fn).__name__}).")
    for _ in range(warmup):  # outside the first repeat's conditions window
        fn()
    cuda = cuda_device_index()
    meter, conds = ConditionsMeter(cuda), []

    def after_each(_i, seconds):  # each repeat's window: from the previous one's end to its own
        conds.append(meter.stop(seconds))
        meter.start()

    meter.start()
    times = time_repeats(fn, device, 0, repeats, after_each)
    where = device_label(cuda)
    return [ProfileRecord(f"{name} {i + 1}", wall_s=t, device=where, conditions=c)
            for i, (t, c) in enumerate(zip(times, conds))]


def median_s(fn, repeats: int = 5, warmup: int = 1, device=None) -> float:
    """Median wall time of ``fn()`` in seconds over ``repeats`` calls after ``warmup``.

    Example: ``tunekit.measure.median_s(lambda: model(x).sum().backward(), repeats=5)``.
    """
    return statistics.median(time_repeats(fn, device, warmup, repeats))


def stats(times, prefix: str = "") -> dict:
    """median/min/max of a list of seconds (NaN when empty): keys ``{prefix}median_s`` etc."""
    if not times:
        return {f"{prefix}median_s": NaN, f"{prefix}min_s": NaN, f"{prefix}max_s": NaN,
                f"{prefix}repeats": 0}
    return {f"{prefix}median_s": statistics.median(times), f"{prefix}min_s": min(times),
            f"{prefix}max_s": max(times), f"{prefix}repeats": len(times)}


BUSY_WORD = "machine busy"


@dataclass(frozen=True)
class Verdict:
    """Whether a change helped, hurt, or stayed within the noise of the measurements; or, when
    the machine was busy, that it could not be judged.

    ``before_conditions``/``after_conditions``: under what conditions each side's judged repeats
    were measured (`core.conditions.combine`; all its repeats when the word is "machine busy"),
    None for plain seconds; ``repeats``: the repeats of each side; ``set_aside``: its busy ones,
    left out; ``busy_reason``: why the first of them was judged busy.

    Example: ``v = tunekit.verdict(before_times, after_times); v.word, v.speedup``.
    """

    speedup: float   # best old time / best new time (> 1: the change is faster)
    band: float      # relative noise band the speed-up had to clear
    word: str        # "helped" | "hurt" | "within noise" | "machine busy"
    before_conditions: Conditions | None = None
    after_conditions: Conditions | None = None
    repeats: tuple = (0, 0)
    set_aside: tuple = (0, 0)
    busy_reason: str = ""

    @property
    def busy(self) -> bool:
        return self.word == BUSY_WORD

    @property
    def conditions(self) -> Conditions | None:
        """Both sides in one verdict (busy if either was), None for plain seconds."""
        return combine([self.before_conditions, self.after_conditions], ["before", "after"])

    def __str__(self) -> str:
        measured = f"{self.speedup:.2f}x, noise band ±{fmt_pct(self.band, 0)}"
        cond = self.conditions
        if self.busy:
            (nb, na), (bb, ba) = self.repeats, self.set_aside
            return (f"machine busy: {measured} measured, uncertain: {bb} of {nb} repeats before and {ba} of "
                    f"{na} after ran on a busy machine ({first_reason(self.busy_reason)}). Re-run when the machine is "
                    "quiet, or take more repeats: busy ones are set aside, each side needs 2 quiet ones")
        if cond is None:  # plain seconds: nothing is known about the machine
            return f"{self.word} ({measured})"
        aside = sum(self.set_aside)
        aside = f", {aside} busy repeat{'s' if aside > 1 else ''} set aside" if aside else ""
        return f"{self.word} ({measured}; machine {cond.verdict}{aside})"

    def conclusion(self, **meaning: str) -> str:
        """The verdict and what it means: ``v.conclusion(helped="...", within_noise="...", hurt="...")``.
        When the machine was busy the verdict alone, which says the result is uncertain and what
        to do: no meaning is drawn from busy runs."""
        bad = sorted(set(meaning) - {"helped", "hurt", "within_noise"})
        if bad:
            raise ValueError(f"conclusion() takes helped=, within_noise=, hurt= (got {', '.join(bad)}).")
        text = meaning.get(self.word.replace(" ", "_"))
        return f"{self} -> {text}" if text and not self.busy else str(self)


def verdict(before, after, floor: float = 0.05) -> Verdict:
    """Compare repeated timings of two settings: seconds (or seconds per token), or records.

    Contention only ever adds time, so each setting is represented by its best repeat and its
    noise by the gap between its two best repeats; the band is the larger gap, at least ``floor``.
    The change helped if it is faster by more than the band, hurt if slower by more.

    Records carry the machine's conditions: a list of ``RunResult`` (``lab.run``; each run is one
    repeat, timed by its fastest step per token so that batch sizes compare) or of
    ``ProfileRecord`` (``tunekit.profile``, ``%%gpuprofile``; each its ``wall_s``). A repeat
    measured busy is set aside; with fewer than 2 quiet (or unknown) repeats on a side, the word is
    "machine busy" and nothing is judged. A run's steps are not repeats: they share its bursts of
    load, its allocator and thread placement, so they agree more than separate runs do.

    >>> tunekit.verdict([1.00, 1.02, 1.30], [0.50, 0.51])   # helped (2.00x, noise band ±5%)
    >>> tunekit.verdict(runs_before, runs_after)             # helped (1.31x, ...; machine quiet)
    """
    floor = real("floor", floor, 0.0, 1.0, low_open=False, high_open=True)  # a relative difference
    kind_a, a, ca = _repeats("before", before)
    kind_b, b, cb = _repeats("after", after)
    if kind_a != kind_b:
        raise ValueError(f"before holds {kind_a} and after {kind_b}: compare like with like.")
    quiet_a = [i for i, c in enumerate(ca) if not (c is not None and c.busy)]
    quiet_b = [i for i, c in enumerate(cb) if not (c is not None and c.busy)]
    counts = dict(repeats=(len(a), len(b)), set_aside=(len(a) - len(quiet_a), len(b) - len(quiet_b)),
                  busy_reason=next((c.reason for c in ca + cb if c is not None and c.busy), ""))
    if len(quiet_a) < 2 or len(quiet_b) < 2:  # shown as measured, never judged
        speedup, band = _compare(a, b, floor)
        return Verdict(speedup, band, BUSY_WORD, combine(ca), combine(cb), **counts)
    speedup, band = _compare([a[i] for i in quiet_a], [b[i] for i in quiet_b], floor)
    return Verdict(speedup, band, noise.word(speedup, band), combine([ca[i] for i in quiet_a]),
                   combine([cb[i] for i in quiet_b]), **counts)


def _compare(before: list, after: list, floor: float) -> tuple[float, float]:
    """(speed-up of the best repeats, noise band of both sides)."""
    return min(before) / min(after), noise.band([before, after], floor)


def _repeats(name: str, values) -> tuple[str, list[float], list]:
    """(kind, seconds, conditions) of one side's repeats; kind: seconds | runs | profiled blocks."""
    if hasattr(values, "conditions") or isinstance(values, (str, bytes)):
        raise ValueError(f"{name} is one record, which is one repeat: pass a list of at least 2 "
                         "(run the setting again; a run's steps are not independent repeats).")
    values = list(values)
    records = [hasattr(v, "conditions") for v in values]
    if any(records) and not all(records):
        raise ValueError(f"{name} mixes records and numbers: pass one or the other.")
    if not all(records):
        try:
            times = [float(v) for v in values]
        except (TypeError, ValueError):
            raise ValueError(f"{name} must hold at least 2 positive finite times (got {values!r}): "
                             "the noise band comes from the gap between the two best repeats.") from None
        conds, kind, what = [None] * len(times), "seconds", "times"
    elif all(hasattr(v, "step_s_min") and hasattr(v, "tokens_per_step") for v in values):
        times = [v.step_s_min / v.tokens_per_step if v.tokens_per_step else math.nan for v in values]
        conds, kind, what = [v.conditions for v in values], "runs", "runs with a measured step time"
    elif all(hasattr(v, "wall_s") and not hasattr(v, "step_s_min") for v in values):
        times = [math.nan if v.error else float(v.wall_s) for v in values]
        conds, kind, what = [v.conditions for v in values], "profiled blocks", "profiled blocks that ran"
    else:
        raise ValueError(f"{name} mixes runs (RunResult) and profiled blocks (ProfileRecord): pass one kind.")
    if len(times) < 2 or not all(math.isfinite(t) and t > 0 for t in times):
        raise ValueError(f"{name} must hold at least 2 {what}, each a positive finite time (got "
                         f"{times!r}): the noise band comes from the gap between the two best repeats.")
    return kind, times, conds
