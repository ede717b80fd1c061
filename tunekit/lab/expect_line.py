"""The dashboard's line under its controls: ``lab.expect`` of the controls' setting, computed on a
thread of its own (`ExpectLine`), and a run's prediction against what it measured (`predicted_line`).

    >>> line = ExpectLine(lab, ipywidgets.HTML())
    >>> line.request({"checkpointing": True}); line.wait(5); line.html.value
    >>> stop_expecting(lab)   # lab.run, before it measures: the Lab's lines' plans stopped at a stage
"""
from __future__ import annotations

import html
import threading
import time
import weakref

from tunekit.core.explain import basis_words
from tunekit.core.fmt import fmt_elapsed, fmt_ms, fmt_pct
from tunekit.core.notes import Note
from tunekit.core.toggles import ToggleError
from tunekit.core.units import is_missing
from tunekit.view.progress import Cancelled, cancellable

_LINES: "weakref.WeakSet" = weakref.WeakSet()   # every line made, gone with its dashboard


def stop_expecting(lab) -> list:
    """Before a measured step of ``lab`` (lab.run): every expectation line of the Lab stopped, its
    queued request dropped and the plan it is making cancelled at its next stage or phase (a fake
    step beside the live one would share its process's memory timeline and CPU). Returns the run's
    note saying it waited, [] where nothing was being planned."""
    t0, stopped = time.perf_counter(), [line for line in list(_LINES) if line.lab is lab and line.stop()]
    if not stopped:
        return []
    return [Note("run.expect_stopped", "the dashboard's expectation line was still planning: stopped before "
                 f"the run measured (waited {fmt_elapsed(time.perf_counter() - t0)})")]


def _box(text: str, color: str) -> str:
    return f'<div style="border-left:4px solid {color};padding:4px 8px;margin:4px 0">{text}</div>'


EXPECT_WAIT_S = 30.0   # how long Run waits for the expectation of its setting (then runs without it)


class ExpectLine:
    """The line under the controls: ``lab.expect`` of the controls' setting, computed on a thread
    of its own so that the controls never wait; the newest request wins (one still computing
    finishes, its answer is dropped if a newer one was asked). Errors are the line's text.

    Example: ``line.request({"checkpointing": True}); line.wait(5); line.html.value``."""

    def __init__(self, lab, widget):
        self.lab, self.html = lab, widget
        self.last = None           # the Expectation shown (None: none yet, or the last request failed)
        self.last_error = None
        self._cond, self._cancel = threading.Condition(), threading.Event()
        self._asked, self._done, self._want, self._thread = 0, 0, None, None
        _LINES.add(self)   # what a run of the Lab stops (stop_expecting)

    def request(self, toggles: dict) -> None:
        """Ask for the expectation of ``toggles`` (lab.run's keywords); returns at once."""
        with self._cond:
            self._asked += 1
            self._want = (self._asked, dict(toggles))
            if self._thread is None:
                # not a daemon: a daemon cut inside torch at exit aborts the process ("terminate called
                # without an active exception", exit 134, seen in a pytest run of tests/project)
                self._thread = threading.Thread(target=self._work, name="tunekit-expect")
                self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Until the newest request is answered (False: ``timeout`` seconds passed first)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._done >= self._asked, timeout)

    def stop(self) -> bool:
        """Drop the queued request and cancel the one being planned (at its next stage or phase:
        view.progress.cancellable), until the thread is gone; the line keeps what it showed. True
        where there was work to stop. Example: ``line.stop()`` (lab.run does: `stop_expecting`)."""
        with self._cond:
            if self._thread is None:
                return False
            self._want = None
            self._cancel.set()
            self._cond.wait_for(lambda: self._thread is None)
            self._cancel.clear()
            return True

    def _work(self) -> None:
        try:
            while True:
                with self._cond:
                    if self._want is None:
                        self._thread = None
                        self._cond.notify_all()
                        return
                    asked, toggles = self._want
                    self._want = None
                with cancellable(self._cancel):
                    text, e, err = self._answer(toggles)
                with self._cond:
                    try:
                        if asked == self._asked:   # still the newest: shown
                            self.html.value, self.last, self.last_error = text, e, err
                    except Exception as exc:   # noqa: BLE001 - a closed widget: the error is kept, the line goes on
                        self.last, self.last_error = None, exc
                    finally:   # answered either way: wait() never hangs on it
                        self._done = max(self._done, asked)
                        self._cond.notify_all()
        except BaseException as exc:
            with self._cond:   # the thread is gone: the next request starts another, no one waits on this one
                self._thread, self._done = None, self._asked
                self._cond.notify_all()
            if not isinstance(exc, Cancelled):   # stopped by a run (stop): nothing to report
                raise

    def _answer(self, toggles: dict):
        """(the line's HTML, the Expectation or None, the exception or None); never raises."""
        try:
            e = self.lab.expect(**toggles, verbose=False)   # its own thread: the line is its display
            how = "" if e.base_run is not None else " · no run measured yet"   # the line says "uncalibrated"
            return _box(html.escape(e.line + how), "#1f77b4"), e, None
        except ToggleError as exc:
            return _box("expected: n/a (" + html.escape("; ".join(exc.problems))[:300] + ")", "#999"), None, exc
        except Exception as exc:   # noqa: BLE001 - planning a model of the user's may fail in any way
            return _box(f"expected: n/a ({html.escape(type(exc).__name__)}: {html.escape(str(exc))[:300]})",
                        "#999"), None, exc


def predicted_line(r) -> str:
    """A run's expectation (made before it ran) against what it measured, '' for none:
    'predicted 31.2 ms/step, measured 33.0 ms: -5.5% off (calibrated by run #3)'."""
    e, m = r.expected_step_s, r.steady_step_s   # the steady step (median): what an expectation predicts
    if is_missing(e) or is_missing(m) or not m > 0:
        return ""
    by = f" ({basis_words(r.expected_from)})"
    return (f"predicted {fmt_ms(e)}/step, measured {fmt_ms(m)}: "
            f"{fmt_pct(e / m - 1, 1, signed=True)} off{by}")
