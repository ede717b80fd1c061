"""`TunekitCallback` for the transformers `Trainer`: a `tunekit.Monitor` per training run, its
figures added to the Trainer's own logs (so every logger the Trainer reports to gets them), and
its summary shown when training ends (tunekit's summary of a record, `integrations.figures.show_summary`).

    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[TunekitCallback()])
    trainer.train()
    cb.monitor.results()

One step is one optimizer step (every micro-batch of gradient accumulation inside it: the tokens
of each forward are summed). ``wait_s`` is the time between two steps: the Trainer fetches the
step's batches there, and logs, evaluates and saves. The Trainer calls the reporting callbacks
(TensorBoard, MLflow, W&B...) before the ones a user adds, so at the start of training this
callback moves itself to the front of the Trainer's callback list (found through the call that
runs it; a canary test pins that): each ``on_log`` then carries the ``tunekit/...`` figures of
the steps since the previous log for every reporter after it, and into ``state.log_history``:
one statistic per figure over those steps (`integrations.figures`). Rows and the Monitor's sinks
number steps as the Trainer does (its ``global_step`` once the step ends), and mark warm-up and
FLOP-counted steps. On a terminal where the Trainer draws its own progress bar, the Monitor's
line is off (``live=None``); otherwise it is cleared before the Trainer prints its log.
A step cut short by an exception is recorded as failed when the notebook cell ends (the Monitor
watches IPython's cells), so no FLOP counter is left running.
"""
from __future__ import annotations

import sys
import time
import warnings

from tunekit.core.extras import missing_extra

try:
    from transformers import TrainerCallback
    from transformers.trainer_callback import CallbackHandler
except ModuleNotFoundError as e:
    raise (missing_extra(e, "tunekit.integrations.transformers") or e) from None

from tunekit.core.validate import flag
from tunekit.integrations.figures import figures, finish
from tunekit.monitor.monitor import Monitor
from tunekit.monitor.options import check_options
from tunekit.monitor.steps import summarize
from tunekit.view.frontend import in_notebook


class TunekitCallback(TrainerCallback):
    """Example: ``Trainer(..., callbacks=[TunekitCallback(log_to="jsonl:run.jsonl")])``.

    Options as `tunekit.Monitor` (``name``, ``peak``, ``dtype``, ``warmup``, ``live``,
    ``log_to``, ``flops``, ``trace``: the step traced, which
    ``tunekit.explain(callback.monitor.record, plan)`` sets against a plan); ``summary`` (default):
    the run's summary at the end of training (`integrations.figures.show_summary`), False: none. The
    Monitor of the latest run is ``callback.monitor``."""

    def __init__(self, *, name: str | None = None, peak: float | None = None, dtype: str | None = None,
                 warmup: int = 1, live: bool | None = None, log_to=(), flops: str = "auto",
                 trace: int | None = None, summary: bool = True):
        self.options = dict(name=name, peak=peak, dtype=dtype, warmup=warmup, live=live, log_to=log_to, flops=flops,
                            trace=trace)
        check_options(**{k: v for k, v in self.options.items() if k != "log_to"})  # refused before the Trainer runs
        self.summary = flag("summary", summary)
        self.monitor = None
        self._logged = 0      # rows already summarized into a log
        self._t_end = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        front(self, sys._getframe(1))
        opts = dict(self.options, name=self.options["name"] or f"Trainer {type(model).__name__}")
        if opts["live"] is None and not getattr(args, "disable_tqdm", True) and not in_notebook():
            opts["live"] = False   # the Trainer's own bar is the progress line: two on one terminal line collide
        self.monitor = Monitor(model, total=state.max_steps or None, **opts)
        self._logged, self._t_end = 0, None

    def on_step_begin(self, args, state, control, **kwargs):
        mon = self.monitor
        if mon is None or mon.closed:
            return
        if mon._open is not None:   # the last step never ended (an exception the Trainer caught)
            mon.end_step("the Trainer began a step before this one ended")
        gap = None if self._t_end is None else time.perf_counter() - self._t_end
        mon.start_step(wait_s=gap, step=state.global_step + 1)   # the Trainer's number for it once it ends

    def on_step_end(self, args, state, control, **kwargs):
        mon = self.monitor
        if mon is not None and mon._open is not None:
            mon.end_step()
            self._t_end = time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kwargs):
        mon = self.monitor
        if mon is None or logs is None or "loss" not in logs:
            return
        rows = mon.rows[self._logged:]
        if not rows:
            return
        rows[-1].setdefault("loss", float(logs["loss"]))
        self._logged = len(mon.rows)
        mon.close_window()   # the memory of every step of the window, read now
        if mon.view is not None:
            mon.view.clear()   # the Trainer prints its log next: on a line of its own
        ours = figures(summarize(rows, mon.peak_tflops), rows)
        logs.update(ours)
        # the Trainer copied these logs into its history before calling back: that copy too
        history = getattr(state, "log_history", None)
        if history and history[-1].get("step") == state.global_step and history[-1].get("loss") == logs["loss"]:
            history[-1].update(ours)

    def on_train_end(self, args, state, control, **kwargs):
        if self.monitor is not None:
            finish(self)


def front(callback, frame) -> bool:
    """Move ``callback`` to the front of the Trainer's callbacks, the CallbackHandler being the
    ``self`` of the frame that called it. Moving an item to the front while that list is walked
    visits no callback twice and skips none (the items before it shift by one, already visited)."""
    handler = frame.f_locals.get("self") if frame is not None else None
    if not isinstance(handler, CallbackHandler):
        warnings.warn("tunekit: could not find the Trainer's callback list; the tunekit/ figures reach only "
                      "the callbacks after this one in on_log (pass it first in callbacks=[...])",
                      RuntimeWarning, stacklevel=3)
        return False
    cbs = handler.callbacks
    if cbs and cbs[0] is not callback and callback in cbs:
        cbs.remove(callback)
        cbs.insert(0, callback)
    return True
