"""``lab.run(on=tunekit.Slurm(...), wait=False)``: the job submitted, then followed by a thread
while the kernel stays free; the handle it returns gives the RunResult when the job ends.

    >>> job = lab.run(steps=200, parallel="fsdp", on=cluster, wait=False)   # returns at once
    >>> job                     # ClusterRun(slurm job 812: running on n[0-1], step 40/200)
    >>> r = job.result()        # waits; the RunResult, already in lab.log as a waited run's

The thread follows the job as ``SlurmJob.wait`` does (``scontrol`` and the job folder's progress
file, every ``poll_s``) and, when it ends, records it in the Lab's log exactly as the waited form
(tunekit.lab.cluster.record): the RunResult, or a failed run with its cause and the steps measured
so far. Shown: in a notebook one line, updated in place (state, nodes, steps) from the thread;
elsewhere one printed line per change of state and one at the end. ``result()`` (``wait()``)
raises what the waited form raises: the JobFailed of a job that ended without a result, and
KeyboardInterrupt after cancelling the job when Ctrl-C stops the wait, as Ctrl-C does there (use
``result(timeout=...)`` to stop waiting without cancelling). ``cancel()`` cancels it; a run
cancelled from here is not recorded (as an interrupted waited run is not).

``watch(fn)``: ``fn(handle, ended)`` from the thread on each change of state, as steps come (at
most every ``WATCH_EVERY_S``) and once at the end, after the end is recorded and before
``result()`` returns it: how the dashboard shows the job in its status line.
"""
from __future__ import annotations

import html
import sys
import threading
import time

from tunekit.core.results import RunResult

WATCH_EVERY_S = 0.25   # steps reported to watchers at most this often (a state change at once)


class ClusterRun:
    """A cluster job followed in the background: ``state``, ``steps_done``, ``done()``,
    ``result(timeout=None)`` / ``wait``, ``cancel()``, ``watch(fn)``; ``job`` the SlurmJob."""

    def __init__(self, lab, job, sent: dict, record, verbose: bool = True, poll_s: float = 0.5):
        """``record(lab, job, sent, outcome)``: how the job's end goes into the Lab's log
        (tunekit.lab.cluster.record, the waited form's)."""
        self.job, self.lab, self._sent, self._record, self.poll_s = job, lab, sent, record, poll_s
        self.state, self.info, self.steps_done = "SUBMITTED", {}, 0
        self.recorded: RunResult | None = None    # what the Lab's log got, once the job ended
        self.watch_error: Exception | None = None  # the last exception a watcher raised
        self._outcome: RunResult | BaseException | None = None
        self._ended, self._cancelled = threading.Event(), False
        self._over = False            # the outcome is known (set with the watchers' list held)
        self._watchers: list = []
        self._lock = threading.Lock()
        self._told = 0.0              # when watchers last heard of a step
        self._view = _view(verbose)
        self._view.show(self.line())
        self._thread = threading.Thread(target=self._follow, name=f"tunekit-slurm-{job.job_id}", daemon=True)
        self._thread.start()

    # --- the thread ------------------------------------------------------------------------------
    def _follow(self) -> None:
        from tunekit.parallel.slurm import JobFailed

        try:
            outcome = self.job.wait(progress=self._stepped, on_state=self._changed, poll_s=self.poll_s)
        except JobFailed as e:
            outcome = e
        except Exception as e:  # noqa: BLE001 - scontrol gone, a timeout: said by result(), not lost in a thread
            outcome = e
        if not self._cancelled and isinstance(outcome, (RunResult, JobFailed)):
            try:
                self.recorded = self._record(self.lab, self.job, self._sent, outcome)
            except Exception as e:  # noqa: BLE001 - the log could not take it: result() raises it
                outcome = e
        with self._lock:
            self._outcome, self._over = outcome, True
            watchers = list(self._watchers)
        self._view.end(self.line(), failed=not isinstance(outcome, RunResult))
        for fn in watchers:        # before result() returns: what it returns is shown everywhere
            self._tell(fn, ended=True)
        self._ended.set()

    def _changed(self, state: str, info: dict) -> None:
        self.state, self.info = state, info
        self._view.show(self.line(), new_state=True)
        self._tell_all()

    def _stepped(self, done: int, total: int) -> None:
        self.steps_done = done
        self._view.show(self.line())
        now = time.monotonic()
        if now - self._told >= WATCH_EVERY_S or done == total:
            self._told = now
            self._tell_all()

    def _tell_all(self) -> None:
        with self._lock:
            watchers = list(self._watchers)
        for fn in watchers:
            self._tell(fn, ended=False)

    def _tell(self, fn, ended: bool) -> None:
        try:
            fn(self, ended)
        except Exception as e:  # noqa: BLE001 - a watcher's failure is its own: the job is followed on
            self.watch_error = e

    def watch(self, fn) -> None:
        """Call ``fn(handle, ended)`` now and on each change from here on (see the module docstring);
        a job that already ended calls it once, ``ended=True``."""
        with self._lock:
            self._watchers.append(fn)
            over = self._over
        self._tell(fn, ended=over)

    # --- the caller's side -----------------------------------------------------------------------
    def done(self) -> bool:
        """Whether the job has ended and its end is recorded."""
        return self._ended.is_set()

    def result(self, timeout: float | None = None) -> RunResult:
        """The RunResult, waiting up to ``timeout`` seconds (None: until the job ends); TimeoutError
        past it (the job goes on). Raises the JobFailed of a job that ended without a result (its
        failed run is in the Lab's log). Ctrl-C while waiting cancels the job, as in the waited form."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not self._ended.wait(0.2):
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"{self.line()}: still going after {timeout:g} s (result() again waits on)")
        except KeyboardInterrupt:
            self.cancel()
            raise
        if isinstance(self._outcome, BaseException):
            raise self._outcome
        return self._outcome

    wait = result

    @property
    def cancelled(self) -> bool:
        """Whether ``cancel()`` stopped it (then nothing is recorded)."""
        return self._cancelled

    @property
    def error(self) -> BaseException | None:
        """Why the job ended without a result (the JobFailed, its failed run in the log), once it ended."""
        return self._outcome if self._over and isinstance(self._outcome, BaseException) else None

    def cancel(self, wait_s: float = 30.0) -> None:
        """scancel the job and wait (up to ``wait_s``) until it is gone; not recorded."""
        if self._ended.is_set():
            return
        self._cancelled = True
        self.job.cancel(wait_s)
        self._ended.wait(wait_s)

    def line(self) -> str:
        """What the job is doing, in one line: "slurm job 812: running on n[0-1], step 40/200"."""
        if self._over:
            from tunekit.core.run_text import result_line

            if self._cancelled:
                return f"slurm job {self.job.job_id}: cancelled (not recorded)"
            if self.recorded is not None:
                return f"slurm job {self.job.job_id}: {result_line(self.recorded)}"
            return f"slurm job {self.job.job_id}: {self._outcome}"
        reason = self.info.get("Reason")
        said = {"PENDING": f"pending ({reason})" if reason not in (None, "None") else "pending",
                "RUNNING": f"running on {self.info.get('NodeList')}"}.get(self.state, self.state.lower())
        steps = f", step {self.steps_done}/{self.job.steps}" if self.steps_done else ""
        return f"slurm job {self.job.job_id}: {said}{steps}"

    def __repr__(self) -> str:
        return f"ClusterRun({self.line()})"


def _view(verbose: bool):
    if not verbose:
        return _Quiet()
    from tunekit.view.frontend import in_notebook

    return _NotebookLine() if in_notebook() else _PrintedStates()


class _Quiet:
    def show(self, line: str, new_state: bool = False) -> None:
        pass

    def end(self, line: str, failed: bool) -> None:
        pass


class _PrintedStates(_Quiet):
    """A terminal or a log: a line per change of state (not per step: the prompt stays usable)."""

    def show(self, line: str, new_state: bool = False) -> None:
        if new_state:
            print(line, file=sys.stdout, flush=True)

    def end(self, line: str, failed: bool) -> None:
        print(line, file=sys.stdout, flush=True)


class _NotebookLine(_Quiet):
    """One display in the submitting cell, updated in place from the thread (by its display id, so
    the update lands there while other cells run)."""

    EVERY_S = 0.5

    def __init__(self):
        from IPython.display import HTML, display

        self.html, self._drawn = HTML, 0.0
        self.handle = display(HTML(""), display_id=True)

    def show(self, line: str, new_state: bool = False) -> None:
        now = time.monotonic()
        if new_state or now - self._drawn >= self.EVERY_S:
            self._drawn = now
            self.handle.update(self.html(f"<div style='font-family:monospace;font-size:12px'>"
                                         f"{html.escape(line)}</div>"))

    def end(self, line: str, failed: bool) -> None:
        color = "#b00020" if failed else "#333"
        self.handle.update(self.html(f"<div style='font-family:monospace;font-size:12px;color:{color}'>"
                                     f"{html.escape(line)}</div>"))
