"""`tunekit.profile`: measure a block outside IPython with a `Probe`."""
from __future__ import annotations

import copy
import functools
import sys

from tunekit.core.records import ProfileRecord
from tunekit.measure.interrupts import closes_gate, deferred_interrupt
from tunekit.profiling.fingerprint import describe, fingerprint, modules_seen, with_body_names
from tunekit.profiling.options import explain_record, plan_error
from tunekit.profiling.probe import Probe


class profile:
    """Measure a block outside IPython; the record is filled on exit and added to `history()`.

    >>> with tunekit.profile(name="step") as rec:
    ...     loss = model(x, y)[1]; loss.backward()
    >>> rec.wall_s, rec.tflops

    The FLOP count is reused while the variables the block reads keep their shapes and values;
    pass `inputs=(...)` to say explicitly what the block depends on. ``trace=True`` adds the time
    by op category (``rec.trace``, a Breakdown) and a Chrome trace; ``memory=True`` the memory
    timeline (``rec.memory``), from the first run on; a traced run counts no FLOPs (it reuses a
    count of the same inputs). ``plan`` (a ``tunekit.plan`` of the step, with ``trace=True``):
    the record's summary sets the traced block against the plan's expected step in one line
    (``rec.explained``, ``tunekit.explain``'s), ``steps`` being how many training steps the block runs.

    One object measures one run at a time; entered again, it makes a new record (each run its
    own row in `history()`). As a decorator, each call of the function is one run:

    >>> @tunekit.profile(name="step")
    ... def train_step(x, y): ...
    """

    def __init__(self, name: str | None = None, flops: str = "auto", model_flops: float | None = None,
                 peak: float | None = None, dtype: str | None = None, inputs=None, trace: bool = False,
                 memory: bool = False, plan=None, steps: int = 1):
        why = plan_error(plan) if plan is not None else None
        if plan is not None and not trace:
            why = "plan= sets the block's traced step against the plan's expected step: add trace=True"
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1 or (steps != 1 and plan is None):
            why = f"steps is how many training steps the block runs (>= 1, with plan=...), got {steps!r}"
        if why:
            raise ValueError(f"tunekit.profile: {why}")
        self.plan, self.steps = plan, steps
        frame = sys._getframe(1)
        self.where = where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
        fp, models = (), None
        if inputs is not None:
            fp = (("inputs", describe(inputs)),)
            models = lambda: modules_seen({"inputs": inputs}, ["inputs"])  # noqa: E731
        elif flops != "never":
            names = with_body_names(frame.f_code.co_filename, frame.f_lineno)
            if names is None:  # no source (exec'd code): all the frame's names
                names = frame.f_code.co_names + frame.f_code.co_varnames
            ns = {**frame.f_globals, **frame.f_locals}
            # taken when the block starts (as a decorator, never: each call has its arguments)
            fp = (lambda: fingerprint(ns, names)) if flops == "auto" else ()  # noqa: E731
            models = lambda: modules_seen(ns, names)  # noqa: E731
        del frame
        # keyed on the place and the name: two blocks sharing a name do not share a count
        self.options = dict(key=f"profile:{where}:{name}", flops=flops, model_flops=model_flops, peak=peak,
                            dtype=dtype, trace=trace, memory=memory)
        self.probe = Probe(name or where, fingerprint=fp, models=models, **self.options)

    def __call__(self, fn):
        """``@tunekit.profile(name=...)`` on a function: each call is one run, its inputs the
        function (its code and the globals it reads) and its arguments."""
        if not callable(fn):
            raise TypeError(f"tunekit.profile(...) decorates a function, got {type(fn).__name__}; "
                            "for a block use `with tunekit.profile(...) as rec:`")
        outer = self

        @functools.wraps(fn)
        def profiled(*args, **kwargs):
            __tracebackhide__ = True  # noqa: F841
            inputs = (fn, args, kwargs)
            run = copy.copy(outer)
            run.probe = Probe(outer.probe.name if outer.probe.name != outer.where else fn.__qualname__,
                              fingerprint=lambda: (("inputs", describe(inputs)),),
                              models=lambda: modules_seen({"inputs": inputs}, ["inputs"]), **outer.options)
            with run:
                return fn(*args, **kwargs)

        return profiled

    # The shield spans the block: Ctrl-C waits while the probe starts and stops, and its gate is
    # open for the block itself. A `with` statement cannot run __exit__ for an exception raised
    # inside __enter__, hence the try; and __exit__ shuts the gate before a Ctrl-C can cut in.
    def __enter__(self) -> ProfileRecord:
        if self.probe.running:
            raise RuntimeError(f"tunekit.profile {self.probe.name!r} is measuring already: one object "
                               "measures one run at a time (nest two tunekit.profile blocks instead)")
        self.shield = shield = deferred_interrupt().__enter__()
        try:
            self.probe.start()
            shield.gate().__enter__()  # a Ctrl-C from the start is raised here
            return self.probe.record
        except BaseException as e:
            try:
                if self.probe.running:
                    self.probe.stop(e)
            finally:
                shield.__exit__(type(e), e, None)
            raise

    @closes_gate
    def __exit__(self, exc_type, exc, tb) -> bool:
        self.shield.open = False
        try:
            self.probe.stop(exc)
            explain_record(self.probe.record, self.plan, self.steps)  # after the probe: not measured
        finally:
            self.shield.__exit__(exc_type, exc, tb)  # raises a Ctrl-C that came meanwhile
        return False  # the exception, if any, reaches the caller unchanged
