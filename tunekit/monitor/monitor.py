"""`tunekit.Monitor`: per-step time, tokens/s, TFLOPS, MFU/HFU, memory and the machine's
conditions inside the user's own training loop.

    mon = tunekit.Monitor(model, name="run 3")
    for batch in mon.iter(loader):             # the wait for each batch is timed apart
        loss = model(**batch).loss; loss.backward(); opt.step(); opt.zero_grad()
        mon.log(loss=loss)
    mon.close()                                # the summary, also a record in tunekit.history()

A step is timed from the previous step's end to its own end (``wall_s``, synchronized with the
device at the end of each step: the one place per step where the CPU waits for the GPU), its own
work apart (``step_s``, from ``start_step``) and the wait for its batch (``wait_s``). FLOPs are
counted on the first step of each input signature (`tap.StepTap`): that step is marked
``counted`` and carries no speed. Model FLOPs come from the model's shape where tunekit knows
the family (the Lab's convention), else from the count. Warm-up steps are marked too, and the
step ``trace=N`` traces (`monitor.traced`); none of them enters the summary (`monitor.steps.summarize`).

This class is the Monitor's I/O: the clocks, the meters, the FLOP tap, the sinks and the view. Its
arithmetic (a step's amounts, row, rates, a window's figures) is `monitor.arithmetic`, pure.
"""
from __future__ import annotations

import math
import time

import torch

from tunekit.core import registry, validate
from tunekit.core.records import ProfileRecord
from tunekit.core.setting import from_keywords
from tunekit.measure.conditions import ConditionsMeter
from tunekit.measure.device import synchronize
from tunekit.measure.history import HISTORY
from tunekit.measure.meters import CudaMeter, PeakWindows, cpu_rss_bytes, malloc_in_use_bytes
from tunekit.measure.torch_private import compiled_graphs
from tunekit.models.adapters import adapt
from tunekit.monitor.arithmetic import (
    amounts,
    error_text,
    speeds_measured,
    step_row,
    window_due,
    window_figures,
)
from tunekit.monitor.gather import gather_ranks
from tunekit.monitor.options import check_options
from tunekit.monitor.rates import FlopRates
from tunekit.monitor.rows import check_scalar, number, replace_monitor_of, results_frame, sink_metrics, summary_record
from tunekit.monitor.steps import COLUMNS, summarize, summary_line
from tunekit.monitor.tap import StepTap
from tunekit.monitor.traced import StepTrace

NaN = math.nan
clock = time.perf_counter
LEFT = "left"   # end_step(LEFT): the loop was left during the step (a break or an exception)


class Monitor:
    """Measure each step of your own loop. Example::

        mon = tunekit.Monitor(model)
        for x, y in mon.iter(loader):
            loss = loss_fn(model(x), y); loss.backward(); opt.step(); opt.zero_grad()
            mon.log(loss=loss)
        mon.close(); mon.results()

    ``tokens``/``samples``: per step, when the model's inputs do not tell (tunekit reads B x S
    from the inputs of its GPT and of transformers models, and the first input's first dimension
    of any other module). ``flops``: "auto" (count each new input signature once) or "never".
    ``model_flops``: the model FLOPs of one step, if you know them better. ``peak``: TFLOPS of the
    device for MFU (default: spec table or CPU calibration). ``warmup``: first steps marked and
    left out of the summary. ``total``: steps expected (progress and ETA; ``iter`` takes
    ``len(loader)``). ``live``: None shows the live view in a notebook or a terminal, True
    always, False never. ``log_to``: "tensorboard:DIR", "mlflow:URI", "jsonl:PATH" (or a list).
    ``setting``: the ``tunekit.Setting`` your loop trains under, instead of ``dtype`` (the peak is
    that of the dtype its matmuls run in: ``Setting(precision="bf16")`` -> bf16). ``trace``: the
    index (0, 1, ...) of one steady step to trace with torch.profiler: ``close()``'s record keeps its
    Breakdown (``.trace``) for ``tunekit.explain(record, plan)``; that step carries no speed.
    """

    @validate.keywords_checked({"dtype": tuple(registry.DTYPES)})
    def __init__(self, model, *, name: str | None = None, tokens: int | None = None,
                 samples: int | None = None, flops: str = "auto", model_flops: float | None = None,
                 peak: float | None = None, dtype: str | None = None, warmup: int = 1,
                 total: int | None = None, live: bool | None = None, log_to=(), setting=None,
                 trace: int | None = None):
        validate.instance("model", model, torch.nn.Module, "a torch.nn.Module")
        s = from_keywords(setting, "Monitor", dtype=dtype)   # a Setting: the peak of the dtype it computes in
        dtype = s.compute if s is not None else dtype
        if next(model.parameters(), None) is None:
            raise ValueError(f"{type(model).__name__} has no parameters: there is no training to monitor")
        o = check_options(name, tokens, samples, flops, model_flops, peak, dtype, warmup, total, live, trace)
        self.name = o["name"] or f"monitor {type(model).__name__}"
        self.tokens, self.samples, self.flops = o["tokens"], o["samples"], o["flops"]
        self.model_flops, self.peak, self.dtype = o["model_flops"], o["peak"], o["dtype"]
        self.warmup, self.total = o["warmup"], o["total"]
        from tunekit.monitor.sinks import open_sinks  # refuses a target it cannot write, before any step

        self.sinks = open_sinks(log_to)
        self.model, self.adapter = model, adapt(model)
        cuda = next((p.device for p in model.parameters() if p.device.type == "cuda"), None)
        self.device = cuda or next(model.parameters()).device   # a CUDA part means a CUDA sync
        self.cuda_index = None if cuda is None else cuda.index if cuda.index is not None else 0
        self.notes: list[str] = []
        self.traced = StepTrace(o["trace"], self.name, self.cuda_index)
        self.flop_rates = FlopRates(self)
        self.flop_rates.prepare()   # a CPU's peak calibration, if one is due: before any step or hook
        replace_monitor_of(model, self)
        self.tap = StepTap(model, self.adapter)
        self.rows: list[dict] = []
        self._open = None            # the step going: its meters and clocks
        self._pending: dict = {}     # scalars logged for the step going
        self._t_end = None           # the previous step's end (after tunekit's own work)
        self._cond = None            # the machine's window going (several short steps, or one)
        self._judged: list = []      # the rows of that window, judged when it closes
        self._whole = ConditionsMeter(self.cuda_index)
        self._cpu = PeakWindows()
        self._uncounted = 0          # steps not counted so far (the first `warmup` are warm-up)
        self._graphs = compiled_graphs()   # graphs Dynamo compiled so far (None: never used)
        self._total_from_len = False
        self.rss0 = self.alloc0 = NaN   # CPU RSS and GPU allocated bytes as the first step starts
        self.heap0 = self.heap = None   # glibc's bytes in use then and at the last window (None: unknown)
        self.loader_error = None
        self.summary = self.record = self.ranks = None
        self.closed = False
        self.view = self._make_view(live)

    def _make_view(self, live):
        from tunekit.monitor.view import MonitorView, watch_cells  # its view; per frontend there

        self._unwatch = watch_cells(self)   # in IPython: a cell that ends inside a step ends that step
        return None if live is False else MonitorView.open(self.name, forced=live is True)

    # --- the loop ---------------------------------------------------------------------------

    def iter(self, loader, total: int | None = None):
        """Yield the batches of ``loader``, each inside a step; the time ``next()`` takes is the
        step's ``wait_s``. ``total``: steps expected (default ``len(loader)``, if it has one).
        Leaving the loop during a step (``break``, an exception) marks that step ``left``: a
        generator cannot tell a break from an error, so it carries no speed and is not called a
        failure. ``with mon.step():`` records an exception with its type."""
        if total is not None:
            self.total = len(self.rows) + validate.count("total", total)
        elif (self.total is None or self._total_from_len) and hasattr(loader, "__len__"):
            self.total, self._total_from_len = (len(self.rows) + len(loader)) or None, True  # this epoch on
        it = iter(loader)
        while True:
            t0 = clock()
            try:
                batch = next(it)
            except StopIteration:
                return
            except Exception as e:   # the loader failed between steps: the run says so
                self.loader_error = f"the loader raised {type(e).__name__}: {e}"
                self._note(self.loader_error)
                raise
            waited = clock() - t0
            self.start_step(wait_s=waited, _t0=t0)
            self._open["from_iter"] = True
            try:
                yield batch
            except GeneratorExit:  # a break or an exception in the body: which, Python does not say
                if self._open is not None:
                    self.end_step(LEFT)
                raise
            if self._open is not None:
                self.end_step()

    def step(self, tokens: int | None = None, samples: int | None = None):
        """``with mon.step(): ...``: one step; an exception in it is recorded and raised."""
        return _Step(self, tokens, samples)

    def start_step(self, tokens: int | None = None, samples: int | None = None,
                   wait_s: float | None = None, _t0: float | None = None, step: int | None = None) -> None:
        """Start a step by hand (callbacks, loops that are not a ``for``); ``end_step`` ends it.
        ``tokens``/``samples``: this step's, when the inputs do not tell; ``wait_s``: the time it
        waited for its data, if you measured it (``iter`` does); ``step``: its number as your
        framework numbers it (a Trainer's global step), in the rows and every sink (default: 0, 1, ...)."""
        if self.closed:
            raise RuntimeError(f"{self.name} is closed: make a new Monitor for another run")
        if self._open is not None and self._open.get("from_iter"):
            self.end_step(LEFT)   # an iterator held and left: its step ends here
        if self._open is not None:
            raise RuntimeError("a step is already going: end_step() before the next start_step()")
        for what, v in (("tokens", tokens), ("samples", samples)):
            if v is not None:
                validate.count(what, v)
        if wait_s is not None:
            validate.real("wait_s", wait_s, low_open=False)
        if step is not None:
            validate.whole("step", step, 0)
        t = clock()
        first = self._t_end is None
        if first:
            self._t_end = _t0 if _t0 is not None else t
            self._whole.start()
            self.rss0 = float(cpu_rss_bytes())   # the run's start: what its memory figures are above
            self.heap0 = malloc_in_use_bytes()   # what RSS may not show (meters.rss_blind_note)
        cuda = None
        if self.cuda_index is not None:   # the allocator's figures of the model's GPU
            cuda = CudaMeter(self.cuda_index)
            cuda.start()
            if first:
                self.alloc0 = float(cuda.alloc0)
        self.tap.begin(count=self.flops == "auto" and not self.traced.due(len(self.rows)))  # never both
        if self._cond is None:  # the machine's windows: back to back from the first step on
            self._cond = ConditionsMeter(self.cuda_index).start()
        traced = self.traced.begin(len(self.rows))   # the profiler on before the step's clock starts
        self._open = dict(t0=clock(), own=clock() - t, wait_s=NaN if wait_s is None else float(wait_s),
                          cuda=cuda, tokens=tokens, samples=samples, step=step, traced=traced)

    def end_step(self, error: BaseException | str | None = None) -> dict:
        """End the step going: its row (a dict of `monitor.steps.COLUMNS` and the logged scalars)."""
        s, self._open = self._open, None
        if s is None:
            raise RuntimeError("no step is going: start_step() first")
        try:
            if self.cuda_index is not None:
                synchronize(self.device)
        finally:
            t1 = clock()
            self.traced.end(t1 - s["t0"], error)   # the profiler off first, whatever happened
            info = self.tap.end()
        row = self._row(s, info, t1, error)
        self.rows.append(row)
        self._judge(row, t1)
        self._deliver(row)
        row["monitor_s"] = s["own"] + info["own_s"] + (clock() - t1)   # hooks in the step included
        self._t_end = clock()
        return row

    def _judge(self, row, t1, last: bool = False) -> None:
        """The machine's verdict and the CPU memory (peak, RSS at its end) for the steps of a
        window, at least ``arithmetic.JUDGE_EVERY_S`` long (their readings cost tens of microseconds: not one
        per millisecond-step), or up to the end: each step of a window gets the window's figures."""
        if row is not None:
            self._judged.append(row)
        cond = self._cond
        if cond is None or not self._judged or not window_due(cond.t0, t1, last):
            return
        c = cond.stop(t1 - cond.t0)
        self.heap = malloc_in_use_bytes()
        window_figures(self._judged, None if c is None else c.verdict, self._cpu.peak(), float(cpu_rss_bytes()))
        for r in self._judged:
            self._write(r)   # each row reaches the sinks whole: its window's memory and machine in it
        self._judged, self._cond = [], cond.follow()

    def close_window(self) -> None:
        """Judge the steps since the last window now (their machine verdict and CPU memory), and
        write them to the sinks: a callback calls it before it logs, so each log has every figure."""
        self._judge(None, clock(), last=True)

    def log(self, **scalars) -> None:
        """Scalars of the step going (or of the last one): ``mon.log(loss=loss, lr=lr)``. Tensors
        are read (``.item()``) when their step ends, after its device synchronize."""
        if self.closed:
            raise RuntimeError(f"{self.name} is closed: its record is made; log before close()")
        for k, v in scalars.items():
            if k in COLUMNS:
                raise ValueError(f"{k!r} is a column tunekit fills; log it under another name")
            check_scalar(k, v)
        if self._open is not None:
            self._pending.update(scalars)
        elif self.rows:
            row = self.rows[-1]
            values = {k: number(v) for k, v in scalars.items()}
            row.update(values)
            if not any(r is row for r in self._judged):   # else written with its row, when judged
                self.sinks.write(row["step"], values)
        else:
            raise RuntimeError("no step yet: log() inside or after a step")

    # --- a step's row ---------------------------------------------------------------------

    def _row(self, s, info, t1, error) -> dict:
        n = len(self.rows)
        gpu = s["cuda"].stop() if s["cuda"] is not None else {}
        alloc0 = float(s["cuda"].alloc0) if gpu else NaN
        tokens, samples, given = amounts(s["tokens"], s["samples"], self.tokens, self.samples, info["tokens"],
                                         info["samples"], info["unknown"])
        if info["unknown"] and not given:   # part of the step could not be read: no guess
            self._note(f"tokens/samples unknown ({info['unknown']}): pass tokens= or samples=")
        elif info["token_ids"] and not given:   # said once (notes are kept once)
            b, seq = info["token_ids"]
            self._note(f"samples/s: the model's input looks like token ids ({b} x {seq} integers); "
                       f"Monitor(..., tokens={b * seq}) or mon.step(tokens=...) gives tokens/s and MFU per token")
        count, cached = info["count"], info["known"]
        if cached is None and info["signature"] and self.flops == "auto":
            self._note("FLOPs counted for 16 input signatures; steps with other inputs have no executed "
                       "FLOPs (no TFLOPS/HFU)" if self.tap.full else "a step whose inputs changed after its "
                       "first forward has no FLOPs; the next step is counted")
        executed = NaN if cached is None else float(cached.executed)
        model = self.flop_rates.model_flops(info, cached)
        graphs, self._graphs = self._graphs, compiled_graphs()   # Dynamo's count since the last step
        compiled = (self._graphs or 0) > (graphs or 0)   # None: Dynamo unused (first imported is no compile)
        if compiled:
            self._note("steps during which torch.compile compiled are marked warm-up (their time is compiling)")
        left = error == LEFT
        if left:
            error = None
        warm = count is None and not left and error is None and self._uncounted < self.warmup
        self._uncounted += count is None
        row = step_row(n, s["step"], t1 - self._t_end, t1 - s["t0"], s["wait_s"], tokens, samples, executed, model,
                       "counted" if count is not None else "cached" if cached is not None else "none", gpu, alloc0,
                       warm or compiled, count is not None, s["traced"], left, error_text(error))
        if speeds_measured(row):
            self.flop_rates.fill(row)
        row.update({k: number(v) for k, v in self._pending.items()})
        self._pending = {}
        return row

    def _write(self, row) -> None:
        """A row to the sinks (`rows.sink_metrics`)."""
        if self.sinks:
            self.sinks.write(row["step"], sink_metrics(row))

    def _deliver(self, row) -> None:
        if self.view is not None:
            self.view.update(self.rows, self.total)

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    # --- the end ----------------------------------------------------------------------------

    def close(self) -> ProfileRecord:
        """End the run: a step still going is recorded as failed, the loggers are closed, ranks
        are gathered (under torch.distributed), and the summary becomes a record in
        ``tunekit.history()``. Calling it again returns the same record."""
        if self.closed:
            return self.record
        try:
            if self._open is not None:
                self.end_step("the monitor was closed during the step")
        finally:
            self.closed = True
            if self._unwatch is not None:
                self._unwatch()   # the cell hook goes now, not at the next cell
            self._judge(None, clock(), last=True)
            self.tap.remove()
            self.sinks.close()
        peak = self.peak_tflops
        self.summary = summarize(self.rows, peak, uncounted="flops='never'" if self.flops == "never" else None)
        self.record = summary_record(self)
        self.traced.attach(self.record, self.rows)   # the traced step's Breakdown, or why there is none
        self.ranks = gather_ranks(self.summary, self.rows)
        if self.ranks is not None:
            self.record.notes.append(self.ranks.line)
        HISTORY.append(self.record)
        if self.view is not None:
            self.view.close(self.rows, self.record)
        return self.record

    def results(self, all: bool = False):
        """A DataFrame, one row per step, shown formatted (time and wait in ms, tokens/s or
        samples/s, TFLOPS, MFU, memory, the machine, a status word, the logged scalars); the
        frame holds the raw numbers. ``all=True``: every column, a plain DataFrame.

        Example: ``mon.results().tail()``."""
        return results_frame(self.rows, all)

    @property
    def peak_tflops(self) -> float | None:
        """The peak MFU is taken against (TFLOPS), once a measured step resolved it."""
        return self.flop_rates.peak_tflops

    def __enter__(self) -> "Monitor":
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        if self._open is not None and exc is not None:
            self.end_step(exc)
        self.close()
        return False

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        s = summarize(self.rows, self.peak_tflops, uncounted="flops='never'" if self.flops == "never" else None)
        return f"<tunekit.Monitor {self.name!r} ({state}): {summary_line(s)}>"


class _Step:
    def __init__(self, mon, tokens, samples):
        self.mon, self.args = mon, (tokens, samples)

    def __enter__(self):
        self.mon.start_step(*self.args)
        return self.mon

    def __exit__(self, kind, exc, tb) -> bool:
        self.mon.end_step(exc)
        return False
