"""One step of a monitored loop under torch.profiler: ``Monitor(..., trace=N)``.

    >>> st = StepTrace(2, "run 3", cuda_index=None)   # trace the step of index 2 (0, 1, 2, ...)
    >>> st.begin(index=2)                              # in start_step, before the step's clock starts
    >>> st.end(step_s, failed=False)                   # in end_step, after its device synchronize
    >>> st.attach(record, rows)                        # at close: the Breakdown on record.trace

The step is traced with `measure.trace.Tracer` (the Lab's and ``%%gpuprofile --trace``'s) from
the step's start to its end, the boundaries of its ``step_s``. Its row is marked ``traced`` and
carries no speed (the profiler slows it); the FLOP counter never runs in it (its Python dispatch
would be traced as the work: a step of new inputs is counted on the next one). Under
torch.distributed each rank traces its own step. A loop that ends before the step, a step that
fails or is left, or a profiler that cannot start: no trace, and a note says why.
"""
from __future__ import annotations

import math

from tunekit.core.notes import Note
from tunekit.monitor.steps import measured, quantile

NaN = math.nan


class StepTrace:
    """The traced step of one Monitor: its tracer while it runs, then its Breakdown."""

    def __init__(self, index: int | None, name: str, cuda_index: int | None):
        self.index, self.name, self.cuda_index = index, name, cuda_index
        self.tracer = None
        self.breakdown = None
        self.why_not: str | None = None   # why no trace was kept (set when the step was due)

    def due(self, index: int) -> bool:
        """Whether the step of this index is the one to trace (the FLOP counter stays off in it)."""
        return self.index is not None and index == self.index and self.why_not is None and self.breakdown is None

    def begin(self, index: int) -> bool:
        """Start the profiler if this step is the traced one; True when it runs."""
        if not self.due(index):
            return False
        from tunekit.measure.trace import Tracer

        try:
            self.tracer = Tracer(f"monitor-{self.name}-step{index}", True, False, self.cuda_index).start()
        except Exception as e:   # e.g. another torch.profiler runs already: the loop goes on untraced
            self.why_not = f"torch.profiler could not start ({type(e).__name__}: {e})"
        return self.tracer is not None

    @property
    def running(self) -> bool:
        return self.tracer is not None

    def end(self, step_s: float, error=None) -> None:
        """Stop the profiler (always); keep its Breakdown unless the step ended with ``error``
        (the Monitor's: an exception, its words, or "left")."""
        tracer, self.tracer = self.tracer, None
        if tracer is None:
            return
        try:
            bd, _ = tracer.stop(NaN if error is not None else step_s)   # its profiler is off, whatever follows
        except Exception as e:   # reading the events failed: the step's figures stand, untraced
            self.why_not = f"its trace could not be read ({type(e).__name__}: {e})"
            return
        if error is None:
            self.breakdown = bd
        else:
            how = ("was left (a break or an exception)" if error == "left" else f"raised {type(error).__name__}"
                   if isinstance(error, BaseException) else f"ended with an error ({error})")
            self.why_not = f"the traced step {how}: no trace kept"

    def attach(self, record, rows) -> None:
        """The Breakdown on ``record.trace`` (its overhead against the median ``step_s`` of the
        measured steps), or a note saying why there is none."""
        if self.index is None:
            return
        if self.breakdown is None:
            why = self.why_not or (f"the loop ended after {len(rows)} steps, before step {self.index}")
            record.notes.append(Note("monitor.untraced", f"no step traced: {why}"))
            return
        bd = self.breakdown
        times = [r["step_s"] for r in rows if measured(r)]
        if times:
            bd.compare_with(quantile(times, 0.5))
        bd.notes.append(f"step {self.index} of the loop, traced from its start to its end; overhead "
                        "against the median of the measured steps")
        if rows[self.index]["warmup"]:
            bd.notes.append(f"step {self.index} was a warm-up step: first-run costs are in its time (trace a later, "
                            "steady step)")
        record.trace = bd
