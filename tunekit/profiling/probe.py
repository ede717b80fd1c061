"""Measure a block: time, CPU/GPU memory, FLOPs, TFLOPS, MFU/HFU.

`Probe` is the one place that measures; the magic, `profile()` and `experiment()` call it. It
never prints, and once its clock has stopped it never raises: a reading that fails becomes a note.
FLOPs follow the `flops` mode:
- ``auto``: count the first run of a block, and again whenever its inputs (see `fingerprint`)
  differ from those of the counted run; otherwise reuse the count. A counted run is slowed by the
  counter, so it reports no TFLOPS; the re-runs do, from an uncounted clock.
- ``always``: count every run (no TFLOPS then). ``never``: no counting.
With ``trace``/``memory`` a run is also traced by torch.profiler (`measure.trace`) from the first
run on, and counts no FLOPs (the counter's dispatch would be traced as the work): it reuses a
count of the same inputs, else it has none and says so. A traced run reports no TFLOPS either
(the profiler slows it); its record says by how much, against the last untraced run of the same
block. Energy (`measure.energy`) is read on every run where a counter is readable.
"""
from __future__ import annotations

import math
import sys
import time

from tunekit.core import validate
from tunekit.core.notes import Note
from tunekit.core.records import History, ProfileRecord
from tunekit.core.registry import DTYPES
from tunekit.core.units import is_missing
from tunekit.measure import nvml
from tunekit.measure.conditions import ConditionsMeter
from tunekit.measure.device import cuda_device_index, device_label, synchronize
from tunekit.measure.energy import EnergyMeter
from tunekit.measure.history import FLOP_COUNTS, HISTORY, LAST_WALLS, remember
from tunekit.measure.interrupts import deferred_interrupt, innermost, interrupt_pending
from tunekit.measure.meters import CpuPeak, CudaMeter
from tunekit.measure.oom import explain_and_free, is_oom
from tunekit.profiling.fingerprint import changed_names
from tunekit.profiling.probe_figures import compiled_graphs, counting_active, fill_flops, fill_rates

NaN = math.nan
FLOPS_MODES = ("auto", "always", "never")

def _held_already() -> bool:
    """An enclosing tunekit path holds Ctrl-C (its shield active, gate shut: the magic's hooks,
    `profile`): a shield of the probe's own would only hand a Ctrl-C on to it, at 2 syscalls."""
    shield = innermost()
    return shield is not None and shield.active and not shield.open


class Probe:
    """Measure one block. ``p.start(); ...; rec = p.stop(exc)``; see `profile()` for the context manager,
    which also keeps a Ctrl-C from landing between start() returning and stop() (by hand, those
    lines are the caller's, as after ``open()``).

    `fingerprint` is a tuple or a zero-argument callable returning one (taken at `start()`).
    `models`: None, or a zero-argument callable returning the (name, module) pairs the block reads
    (`fingerprint.modules_seen`); a counted run watches their forward calls, and a model whose
    shape tunekit knows gives the model FLOPs as the Lab computes them (`measure.model_flops`).
    `inert`: the block's code can run no operation (`fingerprint.runs_nothing`: ``lr = 3e-4``): its
    count is 0, as a counter's, without one. `trivial`: inert, and it makes and frees nothing large
    (`fingerprint.cell_inputs`: ``x = 1``): its memory is not read either (the CPU and GPU
    memory figures NaN), and the record says what was skipped (a note of kind ``readings.trivial``)."""

    # one Probe per profiled cell: slots make it a fixed layout (no instance dict to build and
    # fill, its 30 names at the limit of a shared-key dict)
    __slots__ = ("name", "key", "trace", "memory", "tracer", "energy", "_fp", "_models", "tap", "mode",
                 "model_flops", "peak", "dtype", "history", "inert", "trivial", "counter", "stale",
                 "conditions", "t0", "running", "started", "record", "fp", "count_now", "under_counter",
                 "graphs0", "cpu", "cuda", "index")

    def __init__(self, name: str, key: str | None = None, fingerprint=(), flops: str = "auto",
                 model_flops: float | None = None, peak: float | None = None, dtype: str | None = None,
                 history: History | None = HISTORY, trace: bool = False, memory: bool = False, models=None,
                 inert: bool = False, trivial: bool = False):
        if type(name) is not str:  # (the checks a profiled cell's probe passes cost no call)
            validate.text("name", name)
        if models is not None and not callable(models):
            validate.optional_callable("models", models, "(name, module) pairs")
        if flops != "auto":  # (defaults need no check: every profiled cell makes a probe)
            validate.choice("flops", flops, FLOPS_MODES)
        if model_flops is not None:
            model_flops = validate.real("model_flops", model_flops, low=0.0, low_open=False)
        if peak is not None:
            peak = validate.real("peak", peak)
        if dtype is not None:
            validate.choice("dtype", dtype, DTYPES)
        if not (type(trace) is bool and type(memory) is bool and type(inert) is bool and type(trivial) is bool):
            for flag, value in (("trace", trace), ("memory", memory), ("inert", inert), ("trivial", trivial)):
                validate.flag(flag, value)
        if flops == "always" and (trace or memory):
            raise ValueError("flops='always' counts every run, and a traced run counts none (the counter "
                             "would be traced as the work): use trace/memory with flops='auto' or 'never'")
        self.name, self.key = name, key or name
        self.trace, self.memory, self.tracer, self.energy = trace, memory, None, None
        self._fp, self._models, self.tap = fingerprint, models, None
        self.mode, self.model_flops, self.peak, self.dtype = flops, model_flops, peak, dtype
        self.history, self.inert, self.trivial = history, inert or trivial, trivial
        self.counter, self.stale = None, False
        self.conditions = self.t0 = None
        self.running = self.started = False
        self.record = ProfileRecord(name=name)

    # the clock covers exactly start() .. stop(): readings before and after are outside it
    def start(self) -> "Probe":
        """Start the meters, the counter and the clock. A Ctrl-C meanwhile waits until they are
        all on; if start() itself raises it (no enclosing tunekit path takes it), the probe is
        stopped first, the run recorded as interrupted: the caller never gets it to stop."""
        if _held_already():
            self._start()
            return self
        try:
            with deferred_interrupt():
                self._start()
            return self
        except KeyboardInterrupt as e:
            if self.running:
                self.stop(e)
            raise

    def start_held(self) -> "Probe":
        """`start()` for a caller whose own shield holds Ctrl-C from here to `stop_held()` (the
        magic's hooks): the same, without asking SIGINT's handler again."""
        self._start()
        return self

    def _start(self) -> None:
        if self.started:  # a probe started again: a new run, a new record
            self.record = ProfileRecord(name=self.name)
        self.started = True
        rec = self.record
        rec.started_at = time.time()
        torch = sys.modules.get("torch")  # (torch_if_loaded, without the call)
        auto = self.mode == "auto" and not self.inert  # an inert block's inputs decide nothing
        cached = FLOP_COUNTS.get(self.key) if auto else None
        self.fp = (self._fp() if callable(self._fp) else self._fp) if auto else ()
        stale = auto and cached is not None and cached.fingerprint != self.fp
        self.count_now = torch is not None and not self.inert and (
            self.mode == "always" or (auto and (cached is None or stale)))
        self.stale = stale
        # what is asked for comes first: a traced run traces, and counts nothing (the counter's
        # dispatch would be traced as the work); a valid count of the same inputs is reused
        traced = self.trace or self.memory
        if self.mode != "never" and torch is None:
            rec.notes.append("torch is not imported: no FLOPs to count")
        elif traced and self.count_now:
            self.count_now = False
            why = "changed since the counted run" if stale else "not counted yet"
            rec.notes.append(f"no FLOPs: this traced run counts none (the counter would be traced as the "
                             f"work) and the block's inputs are {why}; a run without --trace counts them")
        if stale and self.count_now:
            what = ", ".join(changed_names(cached.fingerprint, self.fp)) or "inputs"
            rec.notes.append(f"recounted: {what} changed since the counted run")
        # A clock read while an outer FLOP counter runs (a first %%gpuprofile run around this
        # block, say) measures the counter too: such a run must not report TFLOPS.
        self.under_counter = counting_active()
        self.graphs0 = None if self.inert or torch is None else compiled_graphs()  # an inert block compiles nothing
        if self.trivial:  # nothing made, nothing freed: no memory meters (what was skipped: _read_memory)
            self.cpu = self.cuda = None
            self.index = cuda_device_index()
        else:
            self.cpu, self.cuda = CpuPeak(), CudaMeter()
            self.cpu.start()
            self.cuda.start()
            self.index = self.cuda.index
        if self.count_now:
            from tunekit.measure.flops import TunekitFlopCounter  # imports torch, loaded already

            self.counter = TunekitFlopCounter()
            self.counter.__enter__()
            self.tap = self._start_tap(rec)
        self.running = True
        if self.trace or self.memory:
            self._start_tracer(rec)
        self.energy = EnergyMeter(self.index).start()
        if self.index is not None:  # (synchronize(), without asking torch again whether CUDA is on)
            synchronize()
        # reads counters (no state to undo), judged when the record is read; a block that can run
        # nothing (`x = 1`) is short unless preempted (PSI tells): /proc/stat (~16 us) left unread
        self.conditions = ConditionsMeter(self.index, lean=True, judged=False).start(machine=not self.inert)
        self.t0 = time.perf_counter()

    def _start_tap(self, rec):
        if self._models is None or self.model_flops is not None:  # --model-flops: nothing to derive
            return None
        from tunekit.measure.model_flops import ModelTap

        try:
            return ModelTap(self._models()).start()
        except Exception as e:  # the count goes on without it: its convention, and why
            rec.notes.append(f"MFU from the count: the models read could not be watched ({type(e).__name__}: {e})")
            return None

    def _start_tracer(self, rec) -> None:
        if self.under_counter:
            rec.notes.append("not traced: an outer FLOP counter runs around this block, and it would be "
                             "traced as the work")
            return
        from tunekit.measure.trace import Tracer

        try:
            self.tracer = Tracer(self.name, self.trace, self.memory, self.index).start()
        except Exception as e:  # e.g. another torch.profiler already runs: measure without a trace
            rec.notes.append(f"not traced: torch.profiler could not start ({type(e).__name__}: {e})")

    def stop(self, exc: BaseException | None = None) -> ProfileRecord:
        """Read the clock, remove the counter and meters, fill and keep the record. Ctrl-C
        during these lines waits until they are done (then it is raised)."""
        if _held_already():
            return self._stop(exc)
        with deferred_interrupt():
            return self._stop(exc)

    def stop_held(self, exc: BaseException | None = None) -> ProfileRecord:
        """`stop()` for a caller whose own shield holds Ctrl-C (the magic's hooks)."""
        return self._stop(exc)

    def _stop(self, exc):
        counted = sync_error = None
        try:
            if not self.trivial:  # (a trivial block queued no device work: nothing to wait for)
                synchronize()
            if self.t0 is not None:  # None: interrupted before the clock started (no time: NaN)
                self.record.wall_s = time.perf_counter() - self.t0
        except Exception as e:  # an asynchronous device error from the block surfaces here
            sync_error = e
            exc = exc or e
        finally:
            self.running = False
            tracer, self.tracer = self.tracer, None
            counter, self.counter = self.counter, None
            tap, self.tap = self.tap, None
            if counter is not None:  # always leave torch's dispatch stack as we found it
                counter.__exit__(None, None, None)
                counted = counter.result()
            if tap is not None:  # and the models' hooks
                tap.stop()
        rec = self.record
        for step in _STEPS:  # each reading in turn, whatever befell the one before
            try:
                step(self, rec, exc, tracer, counted, tap)
            except Exception as e:  # after the clock, a failing reading is a note, never an error
                rec.notes.append(f"tunekit: {type(e).__name__}: {e}")
        if self.history is not None:
            self.history.append(rec)
        if exc is None and interrupt_pending():  # after the append: a Ctrl-C from then on is raised, not recorded
            rec.error = "KeyboardInterrupt"
            rec.notes.append("Ctrl-C came as the block ended: its figures are complete")
        if sync_error is not None and sync_error is exc:
            raise sync_error  # the block's own (asynchronous) error: recorded, then it reaches the user
        return rec

    # the readings after the clock, in this order; each takes (self, rec, exc, tracer, counted, tap)

    def _read_conditions(self, rec, *_) -> None:
        if self.conditions is not None:  # None: interrupted before the clock started
            rec.conditions = self.conditions.stop(rec.wall_s)

    def _read_energy(self, rec, *_) -> None:
        if self.energy is None:  # interrupted before the clock started
            return
        if self.energy.none is not None:  # no counter readable here: why, and nothing to read
            rec.notes.append(self.energy.none)
            return
        e = self.energy.stop(rec.wall_s)
        rec.energy_j, rec.energy_source, rec.mean_w = e.joules, e.source, e.mean_w
        if e.note:
            rec.notes.append(e.note)

    def _read_trace(self, rec, exc, tracer, *_) -> None:
        if tracer is None:  # a clean run: what the next traced run's overhead is measured against
            if exc is None and not self.count_now and not self.under_counter and not is_missing(rec.wall_s):
                remember(LAST_WALLS, self.key, rec.wall_s)
            return
        rec.trace, rec.memory = tracer.stop(rec.wall_s)  # stops the profiler whatever happens
        if exc is not None:
            rec.notes.append("the block failed: the trace covers it up to the failure")
        last = LAST_WALLS.get(self.key)
        for part in (rec.trace, rec.memory):
            if part is not None and last is not None:
                part.notes.append(f"profiler overhead measured against the last untraced run ({last:.4g} s)")
        if rec.trace is not None:
            if last is None:
                rec.trace.notes.append("profiler overhead unknown: no untraced run of this block to "
                                       "compare with (run it once without --trace)")
            else:
                rec.trace.compare_with(last)

    def _read_memory(self, rec, exc, *_) -> None:
        if exc is not None:
            rec.error = type(exc).__name__ + (f": {exc}" if str(exc) else "")
        if self.trivial:
            rec.notes.append(_TRIVIAL)
            if self.index is None:
                rec.notes.append(_NO_CUDA)
            rec.device = _cpu_label() if self.index is None else device_label(self.index)
            return
        cpu = self.cpu
        rss_delta, peak_delta = cpu.stop()
        rec.cpu_rss_delta_bytes, rec.cpu_peak_delta_bytes = float(rss_delta), float(peak_delta)
        if cpu.note is not None or cpu.unseen is not None:
            rec.notes.extend(n for n in (cpu.note, cpu.unseen) if n)
        gpu = self.cuda.stop()
        self.index = gpu.pop("index", None)
        if self.index is None:  # no CUDA device in use (nor first used in the block): nothing to ask NVML
            rec.notes.append(_NO_CUDA)
            rec.device = _cpu_label()
        else:
            for k, v in gpu.items():
                setattr(rec, k, float(v))
            used, why = nvml.used_bytes(self.index)
            rec.nvml_used_bytes = NaN if used is None else used
            if why:
                rec.notes.append(why)
            rec.device = device_label(self.index)
        if exc is not None and is_oom(exc):
            rec.notes.append(explain_and_free())


_STEPS = (Probe._read_conditions, Probe._read_energy, Probe._read_trace, Probe._read_memory, fill_flops, fill_rates)


_NO_CUDA = "GPU figures n/a: no CUDA device in use"
# what a trivial block's record skipped (one object for every such record)
_TRIVIAL = Note("readings.trivial", "a block that runs nothing and makes or frees nothing large (a one-line "
                "binding): 0 FLOPs without a counter; its memory (CPU RSS and peak, glibc's totals, GPU) and "
                "the machine's CPU counters (/proc/stat) not read")
_CPU_LABELS: dict = {}  # torch's thread count -> device_label(None)


def _cpu_label() -> str:
    """`device_label(None)`, one string per thread count (the same text, no formatting per record)."""
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    label = _CPU_LABELS.get(threads)
    if label is None:
        label = _CPU_LABELS[threads] = device_label(None)
    return label
