"""Predict, then measure: a learner's guess and the Lab's expectation of a change, each set against
the change as measured (the check cell of a chapter's exercise).

    >>> my_guess = 1.3                              # step time with the change / without
    >>> base = lab.run(steps=3, trace=True)         # calibrates the expectation
    >>> expected = lab.expect(checkpointing=True)   # made before the run it predicts
    >>> run = lab.run(steps=3, checkpointing=True)
    >>> tunekit.lab.check_guess(my_guess, expected, run, base)

Both predictions are ratios to the base run (``run.step_s / base.step_s`` measured); each is judged
by how far it is from the measured ratio. A busy machine makes which was closer "uncertain" (the
conditions of both runs are read, as `tunekit.measure.conclude` does), never a failure; the figures stay.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from tunekit.core.conditions import conclude
from tunekit.core.fmt import fmt_pct


@dataclass(frozen=True)
class GuessCheck:
    """The guess, the expectation and the measurement of one change, as ratios to the base run."""

    what: str
    guess: float
    expected: float
    measured: float
    verdict: str

    @property
    def guess_off(self) -> float:
        return self.guess / self.measured - 1

    @property
    def expected_off(self) -> float:
        return self.expected / self.measured - 1

    @property
    def table(self):
        """pandas DataFrame: who predicted what, and how far it was from the measurement."""
        import pandas as pd
        return pd.DataFrame({"ratio": [self.guess, self.expected, self.measured],
                             "off": [self.guess_off, self.expected_off, 0.0]},
                            index=pd.Index(["your guess", "lab.expect", "measured"], name=self.what))

    def figure(self):
        """A plotly bar chart of the three ratios, the measured one as a line across."""
        import plotly.graph_objects as go
        offs = [fmt_pct(off, 0, signed=True) for off in (self.guess_off, self.expected_off)]
        fig = go.Figure(go.Bar(x=["your guess", "lab.expect"], y=[self.guess, self.expected], text=offs,
                               textposition="outside", showlegend=False))
        fig.add_hline(y=self.measured, line_dash="dash", annotation_text=f"measured {self.measured:.2f}x")
        fig.update_layout(title=f"predicted vs measured: {self.what}", yaxis_title="ratio to the base run",
                          yaxis_rangemode="tozero", height=320)
        return fig

    def __repr__(self) -> str:
        return self.verdict

    def _repr_html_(self) -> str:
        import html
        return f"<pre>{html.escape(self.verdict)}</pre>"


RATIO_HELP = "the guess is a ratio of step times, a positive number: 1.0 no change, 1.3 (30% longer), 0.5 half the time"
_RATIO = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*[x×]?\s*", re.IGNORECASE)     # "1.3", "1.3x", "1.3 ×"
_CHANGE = re.compile(r"\s*([+-])\s*([0-9]*\.?[0-9]+)\s*%\s*")               # "+30%", "-20%"
_TIME = re.compile(r"\s*[0-9]*\.?[0-9]+\s*(ms|s|us|µs|sec|seconds?|min)\s*", re.IGNORECASE)


def as_ratio(guess) -> float:
    """A learner's guess as a ratio: a number, or text typed as one ("1.3", "1.3x") or as a signed
    change ("+30%": 1.3, "-20%": 0.8). A time, a bare percent (longer by it, or that share of the
    time?) or anything else is refused with what to write."""
    if isinstance(guess, str):
        if m := _RATIO.fullmatch(guess):
            guess = float(m.group(1))
        elif m := _CHANGE.fullmatch(guess):
            guess = 1 + float(f"{m.group(1)}{m.group(2)}") / 100
        else:
            number = guess.strip().rstrip("%").strip()
            why = (f"{guess!r} is a time" if _TIME.fullmatch(guess) else
                   f"{guess!r} could be {number}% longer (+{number}%) or {number}% of the time "
                   f"({float(number) / 100:g})" if _RATIO.fullmatch(guess.replace("%", "")) else
                   f"{guess!r} is not a positive number")
            raise ValueError(f"check_guess: {why}; {RATIO_HELP}")
    if isinstance(guess, bool) or not isinstance(guess, (int, float)) or not math.isfinite(guess) or guess <= 0:
        raise ValueError(f"check_guess: {RATIO_HELP} (got {guess!r})")
    return float(guess)


def check_guess(guess, expected, run, base, what: str = "step time vs the base run") -> GuessCheck:
    """Set ``guess`` (a ratio: the changed run's step time over the base run's, as `as_ratio` reads
    it) and ``expected`` (`lab.expect`'s Expectation of the changed setting, made before ``run``)
    against ``run.step_s / base.step_s``. Refused before anything is read: a guess that is not a
    positive ratio, runs that did not finish, an expectation without a step."""
    guess = as_ratio(guess)
    for name, r in (("run", run), ("base", base)):
        step = getattr(r, "step_s", None)
        if getattr(r, "status", "ok") != "ok" or not isinstance(step, (int, float)) or not step > 0:
            raise ValueError(f"check_guess: {name} is not a finished run with a step time (a RunResult of lab.run)")
    e_step = getattr(expected, "step_s", None)
    if not isinstance(e_step, (int, float)) or not e_step > 0:
        raise ValueError("check_guess: expected is lab.expect(...)'s answer (an Expectation with a step time)")
    measured = run.step_s / base.step_s
    # over the expectation's own base: the step of the run that calibrated it (uncalibrated: the
    # base setting's expected step), so a base measured on a slower moment does not move it
    ratio = e_step / expected.base_step_s
    closer = "lab.expect" if abs(ratio / measured - 1) < abs(guess / measured - 1) else "your guess"
    figures = (f"measured {measured:.2f}x; your guess {guess:.2f}x ({fmt_pct(guess / measured - 1, 0, signed=True)} "
               f"off), lab.expect {ratio:.2f}x ({fmt_pct(ratio / measured - 1, 0, signed=True)} off)")
    said = ""
    if expected.base_run is not None and expected.base_run != getattr(base, "run_id", None):
        said += f" (lab.expect was calibrated by run #{expected.base_run}, not by the base run given)"
    if not 0.1 <= guess <= 10:   # ten times from 1: often a time or a percent typed as the ratio
        said += f"; your guess {guess:.2f}x is a ratio of step times: was it a time or a percent? 1.3 means 30% longer"
    verdict = conclude(f"{figures}: {closer} was closer{said}", [base, run])
    if verdict.startswith("uncertain:"):   # a busy run withholds who was closer, not the figures the learner waits for
        verdict = f"{figures}{said}; which was closer is {verdict}"
    return GuessCheck(what, guess, ratio, measured, verdict)
