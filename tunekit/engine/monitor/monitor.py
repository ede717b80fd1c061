"""`tunekit.Monitor`: per-step time, tokens/s, TFLOPS, MFU/HFU, memory and the machine's
conditions inside the user's own training loop. Engine layer.

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
the family (the Lab's convention), else from the count. Warm-up steps are marked too; neither
enters the summary (`core.steps.summarize`).
"""
from __future__ import annotations

import math
import time

import torch

from ...core import validate
from ...core.records import ProfileRecord
from ...core.steps import COLUMNS, CURATED, speed_column, summarize, summary_line
from ...measure.conditions import ConditionsMeter
from ...measure.device import synchronize
from ...measure.history import HISTORY
from ...measure.meters import CudaMeter, PeakWindows, cpu_rss_bytes
from ...models.adapters import adapt
from .gather import gather_ranks
from .options import check_options
from .rows import batch_len, number, summary_record
from .tap import StepTap

NaN = math.nan
clock = time.perf_counter
JUDGE_EVERY_S = 0.2   # the machine is judged over windows of one step, or of steps this long together
LEFT = "left: the loop was left during this step (a break or an exception)"


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
    """

    def __init__(self, model, *, name: str | None = None, tokens: int | None = None,
                 samples: int | None = None, flops: str = "auto", model_flops: float | None = None,
                 peak: float | None = None, dtype: str | None = None, warmup: int = 1,
                 total: int | None = None, live: bool | None = None, log_to=()):
        validate.instance("model", model, torch.nn.Module, "a torch.nn.Module")
        if next(model.parameters(), None) is None:
            raise ValueError(f"{type(model).__name__} has no parameters: there is no training to monitor")
        o = check_options(name, tokens, samples, flops, model_flops, peak, dtype, warmup, total, live)
        self.name = o["name"] or f"monitor {type(model).__name__}"
        self.tokens, self.samples, self.flops = o["tokens"], o["samples"], o["flops"]
        self.model_flops, self.peak, self.dtype = o["model_flops"], o["peak"], o["dtype"]
        self.warmup, self.total = o["warmup"], o["total"]
        from .sinks import open_sinks  # refuses a target it cannot write, before any step

        self.sinks = open_sinks(log_to)
        self.model, self.adapter = model, adapt(model)
        p = next(model.parameters())
        self.device = p.device
        self.cuda_index = p.device.index if p.device.type == "cuda" else None
        self.tap = StepTap(model, self.adapter)
        self.rows: list[dict] = []
        self.notes: list[str] = []
        self._open = None            # the step going: its meters and clocks
        self._pending: dict = {}     # scalars logged for the step going
        self._peaks: dict = {}       # dtype -> measure.peaks.Peak
        self._flops_per_token: dict = {}
        self._t_end = None           # the previous step's end (after tunekit's own work)
        self._cond = None            # the machine's window going (several short steps, or one)
        self._judged: list = []      # the rows of that window, judged when it closes
        self._whole = ConditionsMeter(self.cuda_index)
        self._cpu = PeakWindows()
        self.summary = self.record = None
        self.closed = False
        self.view = self._make_view(live)

    def _make_view(self, live):
        if live is False:
            return None
        from ...ui.monitor_view import MonitorView  # the view that shows it; per frontend there

        return MonitorView.open(self.name, forced=live is True)

    # --- the loop ---------------------------------------------------------------------------

    def iter(self, loader, total: int | None = None):
        """Yield the batches of ``loader``, each inside a step; the time ``next()`` takes is the
        step's ``wait_s``. ``total``: steps expected (default ``len(loader)``, if it has one).
        Leaving the loop during a step (``break``, an exception) records that step as not
        finished (`LEFT`): a generator cannot tell a break from an error, so it carries no speed.
        ``with mon.step():`` records an exception with its type."""
        if total is not None:
            self.total = validate.count("total", total)
        elif self.total is None and hasattr(loader, "__len__"):
            self.total = len(loader) or None
        it = iter(loader)
        while True:
            t0 = clock()
            try:
                batch = next(it)
            except StopIteration:
                return
            waited = clock() - t0
            self.start_step(batch, wait_s=waited, _t0=t0)
            try:
                yield batch
            except GeneratorExit:  # a break or an exception in the body: which, Python does not say
                if self._open is not None:
                    self.end_step(LEFT)
                raise
            if self._open is not None:
                self.end_step()

    def step(self, batch=None, tokens: int | None = None, samples: int | None = None):
        """``with mon.step(): ...``: one step; an exception in it is recorded and raised."""
        return _Step(self, batch, tokens, samples)

    def start_step(self, batch=None, tokens: int | None = None, samples: int | None = None,
                   wait_s: float | None = None, _t0: float | None = None) -> None:
        """Start a step by hand (callbacks, loops that are not a ``for``); ``end_step`` ends it.
        ``tokens``/``samples``: this step's, when the inputs do not tell; ``wait_s``: the time it
        waited for its data, if you measured it (``iter`` does)."""
        if self.closed:
            raise RuntimeError(f"{self.name} is closed: make a new Monitor for another run")
        if self._open is not None:
            raise RuntimeError("a step is already going: end_step() before the next start_step()")
        for what, v in (("tokens", tokens), ("samples", samples)):
            if v is not None:
                validate.count(what, v)
        if wait_s is not None:
            validate.real("wait_s", wait_s, low_open=False)
        t = clock()
        if self._t_end is None:
            self._t_end = _t0 if _t0 is not None else t
            self._whole.start()
        cuda = None
        if self.cuda_index is not None:   # the allocator's figures of the model's GPU
            cuda = CudaMeter(self.cuda_index)
            cuda.start()
        self.tap.begin(count=self.flops == "auto")
        if self._cond is None:  # the machine's windows: back to back from the first step on
            self._cond = ConditionsMeter(self.cuda_index).start()
        self._open = dict(t0=clock(), own=clock() - t, wait_s=NaN if wait_s is None else float(wait_s),
                          cuda=cuda, tokens=tokens, samples=samples, batch=batch)

    def end_step(self, error: BaseException | str | None = None) -> dict:
        """End the step going: its row (a dict of `core.steps.COLUMNS` and the logged scalars)."""
        s, self._open = self._open, None
        if s is None:
            raise RuntimeError("no step is going: start_step() first")
        try:
            if self.cuda_index is not None:
                synchronize(self.device)
        finally:
            t1 = clock()
            info = self.tap.end()
        row = self._row(s, info, t1, error)
        self.rows.append(row)
        self._judge(row, t1)
        self._deliver(row)
        row["monitor_s"] = s["own"] + (clock() - t1)
        self._t_end = clock()
        return row

    def _judge(self, row, t1, last: bool = False) -> None:
        """The machine's verdict and the CPU peak for the steps of a window, at least
        ``JUDGE_EVERY_S`` long (their readings cost tens of microseconds: not one per
        millisecond-step), or up to the end: each step of a window gets the window's figures."""
        if row is not None:
            self._judged.append(row)
        cond = self._cond
        if cond is None or not self._judged or (t1 - cond.t0 < JUDGE_EVERY_S and not last):
            return
        c = cond.stop(t1 - cond.t0)
        peak = self._cpu.peak()
        for r in self._judged:
            r["machine"] = None if c is None else c.verdict
            r["cpu_peak_bytes"] = peak
        self._judged, self._cond = [], cond.follow()

    def log(self, **scalars) -> None:
        """Scalars of the step going (or of the last one): ``mon.log(loss=loss, lr=lr)``. Tensors
        are read (``.item()``) when their step ends, after its device synchronize."""
        for k, v in scalars.items():
            if k in COLUMNS:
                raise ValueError(f"{k!r} is a column tunekit fills; log it under another name")
            if not isinstance(v, (int, float, torch.Tensor)) or isinstance(v, bool):
                raise ValueError(f"{k} must be a number or a one-element tensor, got {type(v).__name__}")
        if self._open is not None:
            self._pending.update(scalars)
        elif self.rows:
            row = self.rows[-1]
            values = {k: number(v) for k, v in scalars.items()}
            row.update(values)
            self.sinks.write(row["step"], values)
        else:
            raise RuntimeError("no step yet: log() inside or after a step")

    # --- a step's row ---------------------------------------------------------------------

    def _row(self, s, info, t1, error) -> dict:
        n = len(self.rows)
        rss = cpu_rss_bytes()   # the peak is the window's (see _judge)
        gpu = s["cuda"].stop() if s["cuda"] is not None else {}
        alloc0 = float(s["cuda"].alloc0) if gpu else NaN
        tokens = s["tokens"] or self.tokens or info["tokens"] or None
        samples = s["samples"] or self.samples or info["samples"] or None
        if tokens is None and samples is None and s["batch"] is not None:
            samples = batch_len(s["batch"])
        if info["unknown"] and not (s["tokens"] or s["samples"] or self.tokens or self.samples):
            self._note(f"tokens/samples unknown ({info['unknown']}): pass tokens= or samples=")
        count = info["count"]
        if count is not None:
            self.tap.counts[info["signature"]] = count
        cached = self.tap.counts.get(info["signature"])
        executed = NaN if cached is None else float(cached.executed)
        model = self._model_flops(info, cached)
        err = None if error is None else error if isinstance(error, str) else (
            type(error).__name__ + (f": {error}" if str(error) else ""))
        row = dict(step=n, wall_s=t1 - self._t_end, step_s=t1 - s["t0"], wait_s=s["wait_s"],
                   monitor_s=NaN, tokens=float(tokens) if tokens else NaN,
                   samples=float(samples) if samples else NaN, tokens_per_s=NaN, samples_per_s=NaN,
                   flops=executed, model_flops=model,
                   flops_source="counted" if count is not None else "cached" if cached is not None else "none",
                   tflops=NaN, mfu=NaN, hfu=NaN,
                   cpu_rss_bytes=float(rss), cpu_peak_bytes=NaN,
                   gpu_alloc_bytes=alloc0 + gpu.get("gpu_alloc_delta_bytes", NaN),
                   gpu_peak_bytes=alloc0 + gpu.get("gpu_peak_delta_bytes", NaN),
                   gpu_reserved_bytes=float(gpu.get("gpu_reserved_bytes", NaN)),
                   warmup=n < self.warmup, counted=count is not None,
                   machine=None, error=err)
        if not row["warmup"] and not row["counted"] and err is None:
            self._rates(row, info)
        row.update({k: number(v) for k, v in self._pending.items()})
        self._pending = {}
        return row

    def _model_flops(self, info, cached) -> float:
        if self.model_flops is not None:
            return self.model_flops
        calls = info["calls"]
        if calls and not info["unknown"]:
            per_token = [self._per_token(a, s, trained) for a, _, s, trained in calls]
            if all(f is not None for f in per_token):
                return float(sum(f * n for f, (_, n, _, _) in zip(per_token, calls)))
        return NaN if cached is None else float(cached.model)

    def _per_token(self, adapter, seq, trained):
        """Model FLOPs per token from the shape (None: unknown), once per model, length and mode:
        the weights are counted on the model, which takes a walk over its modules."""
        key = (id(adapter), seq, trained)
        if key not in self._flops_per_token:
            known = adapter.shape is not None
            self._flops_per_token[key] = adapter.model_flops(seq, 1, None, backward=trained)[0] if known else None
        return self._flops_per_token[key]

    def _rates(self, row, info) -> None:
        wall = row["wall_s"]
        for amount in ("tokens", "samples"):
            if row[amount] == row[amount]:
                row[amount + "_per_s"] = row[amount] / wall
        if row["flops"] != row["flops"] and row["model_flops"] != row["model_flops"]:
            return
        from ...measure.peaks import rates, resolve_peak

        dtype = self.dtype or self.tap.dtype or "fp32"
        if dtype not in self._peaks:  # once per dtype; a CPU calibration runs here, untimed
            self._peaks[dtype] = resolve_peak(self.device, dtype, given=self.peak,
                                              allow_calibration=self.cuda_index is None)
        peak = self._peaks[dtype]
        self.peak_tflops, self.peak_source = peak.tflops, peak.source
        if peak.tflops is None:
            self._note(f"no peak known ({peak.source}): pass peak= (TFLOPS) for MFU")
            row["tflops"] = row["flops"] / wall / 1e12
            return
        r = rates(row["flops"], row["model_flops"], wall, peak, self.device, dtype, recheck=False)
        row["tflops"], row["mfu"], row["hfu"] = r.tflops, r.mfu, r.hfu

    def _deliver(self, row) -> None:
        if self.sinks:
            metrics = {k: row[k] for k in ("wall_s", "wait_s", "tokens_per_s", "samples_per_s", "tflops", "mfu",
                                            "hfu", "cpu_peak_bytes", "gpu_peak_bytes")}
            metrics.update({k: v for k, v in row.items() if k not in COLUMNS})
            self.sinks.write(row["step"], metrics)
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
            self._judge(None, clock(), last=True)
            self.tap.remove()
            self.sinks.close()
        peak = getattr(self, "peak_tflops", None)
        self.summary = summarize(self.rows, peak)
        self.record = summary_record(self)
        self.ranks = gather_ranks(self.summary, self.rows)
        if self.ranks is not None:
            self.record.notes.append(self.ranks.line)
        HISTORY.append(self.record)
        if self.view is not None:
            self.view.close(self.rows, self.record)
        return self.record

    def results(self, all: bool = False):
        """A DataFrame, one row per step: the main columns (the speed in tokens/s, or samples/s for
        a model without a sequence, and the logged scalars); ``all=True`` every column.

        Example: ``mon.results().tail()``."""
        import pandas as pd

        df = pd.DataFrame(self.rows, columns=None if self.rows else list(COLUMNS))
        if all or not self.rows:
            return df
        keep = list(CURATED[:3]) + [speed_column(self.rows)] + list(CURATED[3:])
        keep += [c for c in df.columns if c not in COLUMNS]
        return df[keep]

    def __enter__(self) -> "Monitor":
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        if self._open is not None and exc is not None:
            self.end_step(exc)
        self.close()
        return False

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        s = summarize(self.rows, getattr(self, "peak_tflops", None))
        return f"<tunekit.Monitor {self.name!r} ({state}): {summary_line(s)}>"


class _Step:
    def __init__(self, mon, batch, tokens, samples):
        self.mon, self.args = mon, (batch, tokens, samples)

    def __enter__(self):
        self.mon.start_step(*self.args)
        return self.mon

    def __exit__(self, kind, exc, tb) -> bool:
        self.mon.end_step(exc)
        return False
