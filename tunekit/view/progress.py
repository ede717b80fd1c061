"""What ``lab.run``, ``lab.find_max_batch_size``, ``lab.autotune`` and ``tunekit.plan`` show while
they work: the steps, the trial or the fake step going, then one line with the result.

    >>> with RunProgress(steps, progress=None) as shown:      # lab.lab.Lab.run, verbose=True
    ...     shown.result = run(..., progress=shown.tick)
    >>> with SearchProgress("autotune", budget_s) as shown:   # Lab.autotune / find_max_batch_size
    ...     shown.result = autotune(..., progress=shown.tick)
    >>> with WaitProgress("tunekit.plan") as shown:           # planning.planner.plan, verbose=True
    ...     shown.at("the plan's fake step"); shown.say("live bytes, backward")
    >>> with cancellable(flag): lab.expect(verbose=False)   # its thread: stops at a stage once flag is set

A wait inside another on the same thread (``lab.expect``'s two plans) shows on the outer one's
line: one progress, one end line, for the one thing asked.

In a notebook (a Jupyter kernel) one HTML display per cell, updated in place: the steps as a bar,
then the run's line (``core.run_text.result_line``); further runs of the same cell add their line
to it (the last few shown), so a loop of runs stays one small block. Elsewhere one text line on
stderr, redrawn in place (``\\r``) only when stderr is a terminal; otherwise (pytest, a log file)
only the line at the end. A ``progress`` callback given to ``lab.run`` is still called.
"""
from __future__ import annotations

import contextlib
import html
import math
import sys
import threading
import time

from tunekit.core.fmt import fmt_elapsed
from tunekit.core.notes import kind_of
from tunekit.core.run_text import autotune_line, result_line
from tunekit.core.toggles import ToggleError
from tunekit.view.frontend import in_notebook, shell

SHOWN_PER_CELL = 4     # a cell's runs listed in its block (the newest), the earlier ones counted
EVERY_S = 0.1          # at most ten redraws a second, whatever the step time
SHOW_AFTER_S = 2.0     # a wait shorter than this shows nothing (issue 39: over ~2 s, say what and how far)
HEARTBEAT_S = 0.25     # a long wait's redraw: its time moves in a phase that gives no news
BAR = 20               # characters of the text bar
clock = time.perf_counter   # a search's clock (tests put a fake one here)
_local = threading.local()  # this thread's open WaitProgress (`wait_progress`) and cancel flag (`cancellable`)


class Cancelled(BaseException):
    """Raised at the next stage or phase of a wait (`wait_progress`) whose thread's flag was set
    (`cancellable`): the work stops there as at a Ctrl-C, nothing half-made kept (a BaseException:
    no ``except Exception`` of the work takes it for a failure of its own)."""


@contextlib.contextmanager
def cancellable(flag: threading.Event):
    """The waits run inside, on this thread, raise `Cancelled` at their next stage or phase once
    ``flag`` is set (the dashboard's expectation line, stopped by a measured run: lab.expect_line)."""
    before = getattr(_local, "cancel", None)
    _local.cancel = flag
    try:
        yield
    finally:
        _local.cancel = before


def _checkpoint() -> None:
    """`Cancelled` if this thread's work was asked to stop (`cancellable`)."""
    flag = getattr(_local, "cancel", None)
    if flag is not None and flag.is_set():
        raise Cancelled


class RunProgress:
    """A run's display; ``tick(done, total)`` is the ``progress`` callback the run is given."""

    def __init__(self, steps: int, progress=None):
        self.steps, self.user, self.result = steps, progress, None
        self.done, self._drawn, self.t0 = 0, 0.0, time.perf_counter()
        self.view = _NotebookView() if in_notebook() else _TextView(sys.stderr)

    def __enter__(self) -> "RunProgress":
        self.view.draw("lab.run: warm-up and FLOP count (untimed)", None)
        return self

    def tick(self, done: int, total: int) -> None:
        if self.user is not None:
            self.user(done, total)
        self.done, self.steps = done, total
        now = time.perf_counter()
        if done in (0, total) or now - self._drawn >= EVERY_S:
            self._drawn = now
            self.view.draw(f"lab.run: step {done}/{total} · {fmt_elapsed(now - self.t0)}", done / max(total, 1))

    def __exit__(self, kind, exc, _tb) -> bool:
        if exc is None and self.result is not None:
            self.view.end(result_line(self.result), failed=False)
        elif isinstance(exc, ToggleError):   # refused before any work (lab.run's contract): no step to name
            self.view.end(f"lab.run refused before any work ({kind.__name__}): nothing ran", failed=True)
        elif exc is not None:
            failed = getattr(exc, "result", None)  # a NonFiniteRunError carries the recorded run
            self.view.end(result_line(failed) if failed is not None else
                          f"lab.run stopped at step {self.done}/{self.steps}: {kind.__name__}", failed=True)
        return False


class SearchProgress:
    """The display of a search, ``what`` = "find_max_batch_size" or "autotune": the trial going
    with the time against ``budget_s`` (a bar of it), then one line: the max-batch verdict or the
    autotune winner. One display per call: the ``lab.run`` calls inside a search are quiet.
    The engine calls ``trying(micro_batch)`` / ``tried(trial)`` (max batch) or ``tick(elapsed_s,
    budget_s, text)`` (autotune); a ``progress`` callback the caller gave is still called."""

    def __init__(self, what: str, budget_s: float | None, progress=None):
        self.what, self.budget_s, self.user, self.result = what, budget_s, progress, None
        self.trials, self.t0, self._searching = [], clock(), False
        self.view = _NotebookView() if in_notebook() else _TextView(sys.stderr)

    def __enter__(self) -> "SearchProgress":
        self._draw("starting")
        return self

    def _draw(self, text: str) -> None:   # a trial takes far longer than a redraw: no throttle
        spent = clock() - self.t0
        budget = self.budget_s if isinstance(self.budget_s, (int, float)) and self.budget_s > 0 else None
        spent_text = fmt_elapsed(spent) + ("" if budget is None else f" / budget {budget:g} s")
        self.view.draw(f"{self.what}: {text} · {spent_text}", None if budget is None else min(spent / budget, 1.0))

    def trying(self, micro_batch: int) -> None:
        """find_max_batch_size: a trial at ``micro_batch`` starts. The time shown counts from the
        first trial, as the result's ``elapsed_s`` does (setting up is not the search's budget)."""
        if not self.trials and not self._searching:
            self.t0, self._searching = clock(), True
        fit = sum(t.fits for t in self.trials)
        oom = sum(not t.fits and kind_of(t.reason) == "trial.oom" for t in self.trials)
        over = len(self.trials) - fit - oom
        tally = f"{fit} fit, {oom} OOM" + (f", {over} over budget" if over else "")
        self._draw(f"trying micro_batch={micro_batch} · {tally}")

    def tried(self, trial) -> None:
        """find_max_batch_size: a trial ended."""
        self.trials.append(trial)
        if self.user is not None:
            self.user(trial)

    def tick(self, elapsed_s: float, budget_s: float, text: str) -> None:
        """autotune: a trial starts (``text`` says which stage and candidate)."""
        if self.user is not None:
            self.user(elapsed_s, budget_s, text)
        self._draw(text)

    def __exit__(self, kind, exc, _tb) -> bool:
        if exc is None and self.result is not None:
            r = self.result
            line = autotune_line(r) if self.what == "autotune" else f"{self.what}: {r.verdict}"
            self.view.end(line, failed=False)
        elif exc is not None:
            spent = clock() - self.t0
            self.view.end(f"{self.what} stopped after {fmt_elapsed(spent)}: {kind.__name__}", failed=True)
        return False


class WaitProgress:
    """A long wait's display (``tunekit.plan``): shown once ``SHOW_AFTER_S`` have passed, then the
    stage (``at(stage, fraction)``: "the plan's fake step", "advice: combination 2 of at most 7")
    and what it is doing in it (``say(text)``: a pass and its phase), with the time spent; at the
    end one line with the time taken, or where it stopped (a KeyboardInterrupt). A wait that ends
    before anything was shown ends without a line. A daemon thread redraws it every ``HEARTBEAT_S``
    too: it shows at 2 s and its time moves even inside a long phase that gives no news."""

    def __init__(self, what: str):
        self.what, self.stage, self.text, self.fraction, self.view = what, "", "", None, None
        self.t0, self._drawn = clock(), -math.inf
        self._lock, self._stop, self._thread = threading.Lock(), threading.Event(), None

    def __enter__(self) -> "WaitProgress":
        if getattr(_local, "open", None) is None:   # the waits inside show on this one's line
            _local.open = self
        self._thread = threading.Thread(target=self._beat, name="tunekit-progress", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            self.draw()

    def at(self, stage: str, fraction: float | None = None) -> None:
        _checkpoint()
        self.stage, self.text, self.fraction = stage, "", fraction
        self.draw(news=True)

    def say(self, text: str) -> None:
        _checkpoint()
        self.text = text
        self.draw(news=False)

    def draw(self, news: bool = False) -> None:
        """Redraw, once ``SHOW_AFTER_S`` have passed: a new stage at once, a phase or the heartbeat
        at most every ``EVERY_S``."""
        now = clock()
        if now - self.t0 < SHOW_AFTER_S or (not news and now - self._drawn < EVERY_S):
            return
        with self._lock:
            if self.view is None:
                self.view = _NotebookView() if in_notebook() else _TextView(sys.stderr)
            self._drawn = now
            stage, text = self.stage, self.text
            doing = f"{stage}: {text}" if stage and text else stage or text
            self.view.draw(f"{self.what}: {doing} · {fmt_elapsed(now - self.t0)}", self.fraction)

    def __exit__(self, kind, exc, _tb) -> bool:
        if getattr(_local, "open", None) is self:
            _local.open = None
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.view is None:
            return False   # nothing was shown: nothing to end
        spent = fmt_elapsed(clock() - self.t0)
        if exc is None:
            self.view.end(f"{self.what}: done in {spent}", failed=False)
        else:
            self.view.end(f"{self.what} stopped after {spent}, at {self.stage or 'the start'}: {kind.__name__}",
                          failed=True)
        return False


class _Quiet:
    """WaitProgress's stand-in when the caller asked for nothing (``verbose=False``), or (``outer``)
    for a wait inside another on the same thread: its stages and phases shown on the outer's line."""

    def __init__(self, outer: WaitProgress | None = None):
        self.outer = outer

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False

    def at(self, stage: str, fraction: float | None = None) -> None:
        _checkpoint()
        if self.outer is not None:
            self.outer.at(stage, fraction)

    def say(self, text: str) -> None:
        _checkpoint()
        if self.outer is not None:
            self.outer.say(text)


def wait_progress(what: str, verbose: bool):
    """A `WaitProgress` for ``what``, or a silent stand-in for ``verbose=False``; inside another
    wait of this thread, that one's line (``lab.expect``: its plans show as one progress)."""
    if not verbose:
        return _Quiet()
    outer = getattr(_local, "open", None)
    return WaitProgress(what) if outer is None else _Quiet(outer)


def text_bar(fraction: float) -> str:
    full = round(BAR * min(max(fraction, 0.0), 1.0))
    return "[" + "#" * full + "." * (BAR - full) + "]"


class _TextView:
    """stderr: redrawn in place on a terminal, the last line only elsewhere."""

    def __init__(self, stream):
        self.stream = stream
        self.tty = bool(getattr(stream, "isatty", lambda: False)())

    def draw(self, text: str, fraction: float | None) -> None:
        if self.tty:
            bar = "" if fraction is None else " " + text_bar(fraction)
            self.stream.write(f"\r{text}{bar}\x1b[K")
            self.stream.flush()

    def end(self, line: str, failed: bool) -> None:
        self.stream.write(("\r" if self.tty else "") + line + ("\x1b[K" if self.tty else "") + "\n")
        self.stream.flush()


class _NotebookView:
    """One display per cell, updated in place: the runs of the cell so far and the one going."""

    _cell: dict = {}   # the current cell's execution count, its display and its lines

    def __init__(self):
        from IPython.display import HTML, display

        count = shell().execution_count
        cell = _NotebookView._cell
        if cell.get("count") != count:
            cell.clear()
            cell.update(count=count, lines=[], handle=display(HTML(""), display_id=True))
        self.cell, self.html = cell, HTML

    def _show(self, current: str) -> None:
        lines = self.cell["lines"]
        earlier = len(lines) - SHOWN_PER_CELL
        body = (f"<div style='color:#888'>(+{earlier} earlier runs in this cell)</div>" if earlier > 0 else "")
        body += "".join(lines[-SHOWN_PER_CELL:]) + current
        self.cell["handle"].update(self.html(f"<div style='font-family:monospace;font-size:12px'>{body}</div>"))

    def draw(self, text: str, fraction: float | None) -> None:
        bar = "" if fraction is None else f" <progress value='{fraction:.3f}' max='1' style='width:12em'></progress>"
        self._show(f"<div>{html.escape(text)}{bar}</div>")

    def end(self, line: str, failed: bool) -> None:
        color = "#b00020" if failed else "#e65100" if "⚠" in line else "#333"   # failed red, busy orange
        self.cell["lines"].append(f"<div style='color:{color}'>{html.escape(line)}</div>")
        self._show("")
