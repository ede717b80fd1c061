"""`TunekitCallback` for Lightning's `Trainer`: a `tunekit.Monitor` per fit, its figures sent to
every logger of the Trainer (``trainer.loggers``), its summary shown when training ends
(`integrations.figures.show_summary`).

    trainer = L.Trainer(max_steps=100, callbacks=[TunekitCallback()])
    trainer.fit(module, loader)

One step is one optimizer step (``accumulate_grad_batches`` micro-batches, tokens summed over
their forwards). ``wait_s`` is the time between two steps, where Lightning fetches the next batch
(and runs its other hooks). The loss is read from what ``training_step`` returns. An exception in
training ends the step going as failed (``on_exception``), so no FLOP counter is left running.
Steps are numbered as Lightning numbers them (``trainer.global_step`` once the step ends); each
log holds one statistic per figure over the steps since the last (`integrations.figures`); with
Lightning's own progress bar on a terminal, the Monitor's line is off (``live=None``).
Works with ``lightning`` (``import lightning.pytorch``) or the older ``pytorch_lightning``.
"""
from __future__ import annotations

import time

from tunekit.core.extras import missing_extra

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the standalone package of older releases
    try:
        from pytorch_lightning.callbacks import Callback
    except ModuleNotFoundError:   # neither: said as every missing extra is, naming today's package
        raise missing_extra(ModuleNotFoundError(name="lightning"), "tunekit.integrations.lightning") from None

from tunekit.core.validate import flag
from tunekit.integrations.figures import figures, finish
from tunekit.monitor.monitor import Monitor
from tunekit.monitor.options import check_options
from tunekit.monitor.steps import summarize
from tunekit.view.frontend import in_notebook


class TunekitCallback(Callback):
    """Example: ``L.Trainer(max_steps=50, callbacks=[TunekitCallback(log_to="jsonl:run.jsonl")])``.

    Options as `tunekit.Monitor` (``name``, ``peak``, ``dtype``, ``warmup``, ``live``,
    ``log_to``, ``flops``, ``trace``: the step traced, which
    ``tunekit.explain(callback.monitor.record, plan)`` sets against a plan); ``log_every``: steps
    between two sends to the Trainer's loggers (default: the Trainer's ``log_every_n_steps``);
    ``summary`` (default): the fit's summary at the end of training (`integrations.figures.show_summary`),
    False: none. The Monitor of the latest fit is ``callback.monitor``."""

    def __init__(self, *, name: str | None = None, peak: float | None = None, dtype: str | None = None,
                 warmup: int = 1, live: bool | None = None, log_to=(), flops: str = "auto",
                 trace: int | None = None, log_every: int | None = None, summary: bool = True):
        self.options = dict(name=name, peak=peak, dtype=dtype, warmup=warmup, live=live, log_to=log_to, flops=flops,
                            trace=trace)
        check_options(**{k: v for k, v in self.options.items() if k != "log_to"})
        self.summary = flag("summary", summary)
        self.log_every = None if log_every is None else check_options(total=log_every)["total"]
        self.monitor = None

    def on_train_start(self, trainer, pl_module):
        opts = dict(self.options, name=self.options["name"] or f"Lightning {type(pl_module).__name__}")
        total = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
        if opts["live"] is None and getattr(trainer, "progress_bar_callback", None) is not None and not in_notebook():
            opts["live"] = False   # Lightning's own bar is the progress line: two on one terminal line collide
        self.monitor = Monitor(pl_module, total=total, **opts)
        self._logged, self._t_end = 0, None

    def _accumulate(self, trainer) -> int:
        return max(int(getattr(trainer, "accumulate_grad_batches", 1) or 1), 1)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        mon = self.monitor
        if mon is None or mon.closed or batch_idx % self._accumulate(trainer):
            return
        if mon._open is not None:
            mon.end_step("Lightning began a step before this one ended")
        gap = None if self._t_end is None else time.perf_counter() - self._t_end
        mon.start_step(wait_s=gap, step=trainer.global_step + 1)   # Lightning's number for it once it ends

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        mon = self.monitor
        if mon is None or mon._open is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        last = (batch_idx + 1) % self._accumulate(trainer) == 0 or trainer.is_last_batch
        if loss is not None and hasattr(loss, "detach"):
            mon.log(loss=loss.detach())
        if not last:
            return
        mon.end_step()
        self._t_end = time.perf_counter()
        every = self.log_every or max(int(getattr(trainer, "log_every_n_steps", 50) or 50), 1)
        if len(mon.rows) - self._logged >= every:
            self._send(trainer)

    def _send(self, trainer):
        mon = self.monitor
        rows = mon.rows[self._logged:]
        self._logged = len(mon.rows)
        mon.close_window()   # the memory of every step of the window, read now
        metrics = figures(summarize(rows, mon.peak_tflops), rows)
        if metrics:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)

    def on_exception(self, trainer, pl_module, exception):
        mon = self.monitor
        if mon is not None and not mon.closed:
            if mon._open is not None:
                mon.end_step(exception)
            mon.close()

    def on_train_end(self, trainer, pl_module):
        mon = self.monitor
        if mon is not None and not mon.closed:
            if mon._open is not None:
                mon.end_step("Lightning ended training during the step")
            if len(mon.rows) > self._logged:
                self._send(trainer)
            finish(self)
