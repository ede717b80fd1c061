"""Timing trials as timing tools take a figure: the fastest of repeated trials (`fastest`), over
rounds in a fixed order (`rounds`), interleaved over every figure of a calibration (`interleaved`,
what measure.stream's CPU figures are taken with), and the spread of figures over several
calibrations (`spread`, `spreads`). Measurement layer.

Why interleaved (issue 39): this VM's host noise is correlated in time, slow spells of seconds. A
figure whose trials all run back to back inside one short window takes its fastest from that window
only, and two calibrations minutes apart then disagree by whichever spell each figure's window hit.
Round-robin over all figures, each one's trials are spread over the whole calibration, and its
fastest comes from the best moments of all of it.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable

from tunekit.measure.priority import ahead

TRIES = 5      # trials of each figure at least; more while one still finds a faster time (`fastest`)
MAX_TRIES = 60
ROUND_TRIES = 2   # of each compute figure per round (`rounds`): the fastest of 2 or more
ROUNDS, MAX_ROUNDS = 2, 4   # rounds of the compute figures: 2 at least, more while they still get faster
LEAST_SPREAD, MOST_SPREAD = 8, 12   # `interleaved` rounds over every figure: 8 at least, more while faster


@dataclass(frozen=True)
class Trial:
    """One figure's trial for `interleaved`: ``run()`` returns its seconds; ``per_round`` timed trials
    of it each round (a trial of microseconds takes a few, the fastest kept); ``warm``: each timed one
    right after an untimed one (see `fastest`), as a figure whose trials ran back to back had it."""

    run: Callable[[], float]
    per_round: int = 1
    warm: bool = False


def built(make, *args, **kwargs):
    """``make(*args, **kwargs)`` run ahead of the machine's other work (`measure.priority.ahead`), as
    the trials it makes will be: a calibration's setup (its tensors made and first touched) otherwise
    waits its turn on a loaded machine, 89 of a calibration's 145 s at load 12 on 2 cores (2026-12-06)."""
    with ahead():
        return make(*args, **kwargs)


def schedule(trials: dict) -> list:
    """One round of `interleaved`, as the name of each timed trial in turn: every trial in ``trials``'
    order (name -> `Trial`), ``per_round`` times one after another."""
    return [name for name, t in trials.items() for _ in range(t.per_round)]


def interleaved(trials: dict, least: int = LEAST_SPREAD, most: int = MOST_SPREAD, times: dict | None = None,
                until: float | None = None, shielded: bool = True, say=None) -> dict:
    """Each trial's fastest seconds (``trials``: name -> `Trial`), taken round-robin: each round runs
    every trial in turn (`schedule`), at least ``least`` rounds, then more while a round still makes
    them 1% faster on average (`faster_by`), at most ``most``; no round starts after ``until`` (a
    ``time.perf_counter()`` reading: a time cap before ``least`` too). A figure's fastest is then the
    fastest of trials spread over the whole calibration, not of one burst. Each timed trial (after its
    untimed one where ``warm``) runs ahead of the machine's other work (`measure.priority.ahead`;
    ``shielded=False``: as it is, a GPU's). ``times``: where given, filled with each name's every timed
    seconds, in order. ``say``: told how far it is at each round's start ("round 3 of 8 to 12")."""
    best = dict.fromkeys(trials, float("inf"))
    for done in range(1, most + 1):
        if say is not None:
            say(f"round {done} of {least} to {most}" if least < most else f"round {done} of {most}")
        before = dict(best)
        for name in schedule(trials):
            trial = trials[name]
            with ahead() if shielded else nullcontext():
                if trial.warm:
                    trial.run()   # untimed: the caches, pages and threads as this trial leaves them
                t = trial.run()
            best[name] = min(best[name], t)
            if times is not None:
                times.setdefault(name, []).append(t)
        if done >= least and faster_by(before, best) < 0.01 or until is not None and time.perf_counter() >= until:
            break
    return best


def timed(fn, per: int = 1):
    """A trial of ``fn`` for `fastest`: its seconds over ``per`` (what ``fn`` keeps freed outside
    its time), warmed up once now."""
    def trial():
        s = time.perf_counter()
        out = fn()
        t = time.perf_counter() - s
        del out
        return t / per

    fn()
    return trial


def rounds(trials: dict, tries: int = ROUND_TRIES, least: int = ROUNDS, most: int = MAX_ROUNDS) -> dict:
    """Each trial's fastest time (``trials``: name -> a trial returning its seconds) over rounds in a
    fixed order: each round takes the `fastest` (warm) of ``tries`` or more of every trial in turn; at least
    ``least`` rounds, then more while a round still makes them 1% faster on average (`faster_by`), at most
    ``most``. A slow spell of the machine then slows one round, not every try of a figure."""
    best = dict.fromkeys(trials, float("inf"))
    for done in range(1, most + 1):
        before = dict(best)
        for name, trial in trials.items():
            best[name] = min(best[name], fastest(trial, tries, warm=True))
        if done >= least and faster_by(before, best) < 0.01:
            break
    return best


def faster_by(before: dict, after: dict) -> float:
    """How much faster ``after``'s times are than ``before``'s, per figure on average: the mean of
    (before - after) / before over ``after``'s names (a figure with no time before, inf, counts 1.0:
    all of it new), so the many small figures weigh as much as the few slow ones."""
    shares = [1.0 if before[k] == float("inf") else (before[k] - t) / before[k] for k, t in after.items()]
    return sum(shares) / len(shares) if shares else 0.0


def fastest(trial, tries: int = TRIES, warm: bool = False) -> float:
    """The fastest of repeated trials (``trial()`` returns its own seconds), as timing tools take a
    figure: ``tries`` at least, then more until ``tries`` in a row find none faster by 1%, at most
    ``max(MAX_TRIES, 3 x tries)``. Load only ever slows a trial: on a busy machine the fastest is
    found among more of them, so a calibration taken beside other work lands near a quiet one's.
    Each trial runs ahead of the machine's other work where the user may ask for it
    (`measure.priority.ahead`): on two cores beside two busy processes the fastest trial alone
    stayed 2-7x the quiet one. ``warm``: each timed trial right after an untimed one in the same
    run ahead of the load, so it starts from the state it leaves (caches, pages, the thread pool
    awake) rather than from what ran in the pause before it: a burst of 64-cube fp32 matmuls on 2
    threads took 0.028-0.064 TFLOPS over four processes as the first trial after the pause, and
    0.029-0.031 right after an untimed one (2026-12-06, load ~20)."""
    best, since, n = float("inf"), 0, 0
    while n < max(MAX_TRIES, 3 * tries) and (n < tries or since < tries):
        with ahead():
            if warm:
                trial()   # untimed: the caches, pages and threads as this trial leaves them
            t = trial()
        n += 1
        since = 0 if t < 0.99 * best else since + 1
        best = min(best, t)
    return best


def best_s(fn, tries: int = TRIES) -> float:
    """``fn``'s time, warmed up once: the fastest of ``tries`` or more (`fastest`)."""
    def trial():
        s = time.perf_counter()
        out = fn()
        t = time.perf_counter() - s
        del out   # what fn keeps is freed outside its time
        return t

    fn()
    return fastest(trial, tries)


def spread(values) -> float:
    """The largest of positive ``values`` over the smallest: 1.0 where all agree, nan for none."""
    values = list(values)
    return max(values) / min(values) if values and min(values) > 0 else float("nan")


def spreads(records: list) -> dict:
    """Each figure's `spread` over ``records`` (dicts of name -> number, as `figures` gives), for the
    names every record has, in the first record's order."""
    return {k: spread(r[k] for r in records) for k in records[0] if all(k in r for r in records)} if records else {}
