"""One single-process ``lab.run``: check, apply, probe, warm up, time, trace, record; and what a
run that fails leaves behind.

    >>> result = run(lab, steps=20, warmup=2, progress=None, guard=True, trace=False, memory=False,
    ...              s=lab.setting_of(precision="bf16"))

Ctrl-C waits while the run sets up, records or is undone: only its steps (the FLOP probe's, the
warm-up, the timed and the traced ones) run in the shield's gate. A step whose loss or, at the
end, a weight is not finite stops the run, which is recorded as failed and undone (``guard``);
an out-of-memory error leaves no gradients and frees memory; an interrupted run is not recorded.
"""
from __future__ import annotations

import math
import time
from statistics import median

from tunekit.core.results import RunResult
from tunekit.core.setting import Setting
from tunekit.core.toggles import ToggleError, Toggles, label, normalized, notices
from tunekit.lab import fit
from tunekit.lab.expect_line import stop_expecting
from tunekit.measure.conditions import ConditionsMeter
from tunekit.measure.device import device_label
from tunekit.measure.device_meter import DeviceMeter
from tunekit.measure.energy import EnergyMeter
from tunekit.measure.flops import counting_active
from tunekit.measure.interrupts import deferred_interrupt
from tunekit.measure.meters import minor_faults
from tunekit.measure.oom import ADVICE, drop_frames, free_memory, is_oom
from tunekit.measure.timing import time_repeats
from tunekit.models.naming import model_label
from tunekit.models.optimizers import state_bytes
from tunekit.train.guard import NonFiniteRunError, Snapshot, _check, _NonFinite, weights_finite
from tunekit.train.record import Steps, run_result


def run(lab, steps, warmup, progress, guard, trace, memory, s: Setting) -> RunResult:
    """``lab.run`` in this process (see its docstring) of the Setting ``s`` made at its edge
    (``lab.setting_of``): its toggles; what an interrupted run's traceback held is freed before the
    KeyboardInterrupt goes on."""
    with deferred_interrupt("lab.run undid the interrupted run") as shield:
        try:
            return _run(lab, shield, steps, warmup, progress, guard, trace, memory, s)
        except KeyboardInterrupt as e:  # undone in _run; what its traceback held goes now
            drop_frames(e)
            free_memory(lab.device)
            raise


def _run(lab, shield, steps, warmup, progress, guard, trace, memory, s: Setting) -> RunResult:
    t = s.toggles
    errors = lab.check(t, steps, warmup)
    for what, flag in (("guard", guard), ("trace", trace), ("memory", memory)):
        if not isinstance(flag, bool):
            errors.append(f"{what} must be True or False (got {flag!r}).")
    if errors:
        raise ToggleError(errors)
    t, steps, warmup = normalized(t), int(steps), int(warmup)
    lab.log.check_writable()  # fail before training: a finished run is never lost
    notes = stop_expecting(lab)   # no fake step planned beside the measured ones (the dashboard's line)
    notes = lab.apply(t, notices(t, lab.env()) + notes)
    if t.compile and warmup < 1:
        warmup = 1
        notes.append("warm-up raised to 1: the first compiled step compiles")
    lab.recover()  # a run that failed earlier (OOM, Ctrl-C) may have left gradients
    # before the FLOP probe and the steps allocate: a CPU out-of-memory kills the process
    fit.check(lab, t, guard)
    snap = Snapshot.take(lab) if guard else None
    try:
        probe, flops_source = lab.trainer.probe(t)
        warm = []
        inside = 1 if warmup >= 2 else 0   # the last warm-up step runs inside the peak meter: see measure_steps
        with shield.gate():
            for i in range(warmup - inside):
                warm.append(lab.train_step(t))
                _check(warm[-1], f"the loss of warm-up step {i + 1}")
        measured = measure_steps(lab, t, steps, progress, untimed=inside)
        if trace or memory:
            measured.trace, measured.memory = traced_step(lab, t, median(measured.times), trace, memory)
        if not weights_finite(lab.model):
            raise _NonFinite("a weight after the last step")
    except _NonFinite as e:
        if snap is not None:
            snap.restore()
        undone = ("weights, optimizer and scaler are back as before the run" if snap is not None
                  else "the weights were NOT restored (guard=False)")
        result = _failed(lab, t, warmup, f"{e} is not finite: the run stopped there; {undone}", notes, snap)
        raise NonFiniteRunError(result.error, result) from None
    except BaseException as e:
        _undo(lab, e, snap)
        if is_oom(e):
            drop_frames(e)  # a kept traceback (Jupyter keeps the last) would pin the step's tensors
            free_memory(lab.device)
            undone = ""
            if snap is not None:
                snap.restore()  # an optimizer step cut short may have updated some weights
                undone = " weights, optimizer and scaler are back as before the run;"
            e.add_note(f"tunekit: lab.run ran out of memory at micro_batch={t.micro_batch}, "
                       f"seq_len={t.seq_len}; its gradients were dropped and memory freed;{undone} "
                       f"{ADVICE}; lab.find_max_batch_size() finds the largest micro-batch that fits.")
        raise
    measured.losses[:0] = warm
    return _record(lab, t, warmup, measured, probe, flops_source, notes, snap)


def _undo(lab, e: BaseException, snap) -> None:
    """After a run that failed: no gradients left. One interrupted (Ctrl-C) is not a run: it
    is not recorded, and it is undone (with ``guard``); run() then frees its tensors, also
    those its traceback held (cut below run(), with a note saying where it stopped)."""
    lab.recover()
    if isinstance(e, KeyboardInterrupt) and snap is not None:
        snap.restore()


def measure_steps(lab, t: Toggles, steps: int, progress=None, untimed: int = 0) -> Steps:
    """``steps`` timed training steps under ``t`` (applied already), with the peak memory of
    the device over them. The peak meter always stops, also when a step fails; a step whose
    loss is not finite stops the steps (``_NonFinite``).

    ``untimed`` warm-up steps run first inside the meter, off the clock (their losses lead
    ``losses``). On a CPU the meter's start hands glibc's freed heap pages back (``malloc_trim``),
    and the next step faults them in again: ~1 us a page, 10-20 ms on the built-in GPT's
    36 ms step (benchmarks/bench_mb_growth.py). ``lab.run`` with two or more warm-up steps runs
    its last one here, so that cost lands before the clock, not in the first timed step. The
    process's minor page faults over the timed steps are counted (``ru_minflt`` at each end):
    where glibc trims its heap at a free, each step faults the pages in again (train.record's
    ``measure.page_faults`` note says so past a share of the step).
    """
    with deferred_interrupt() as shield:  # the meter goes on and off whole; the steps run in the gate
        meter = DeviceMeter(lab.device, lab.cuda_index).start()
        slowed = counting_active()  # an enclosing %%gpuprofile's first run is counting
        losses, peak = [], None
        energy = EnergyMeter(lab.cuda_index)   # started with the clock: over the timed steps only
        conditions = ConditionsMeter(lab.cuda_index)

        def tick(i, _s):  # after the step's clock: the finiteness check syncs, the clock did too
            _check(losses[-1], f"the loss of step {i + 1}")
            if progress is not None:
                progress(i + 1, steps)

        try:
            with shield.gate():
                for _ in range(untimed):
                    losses.append(lab.train_step(t))
                    _check(losses[-1], "the loss of the last warm-up step")
                if progress is not None:
                    progress(0, steps)  # warm-up and FLOP count are done: the clock starts
                energy.start()
                conditions.start()
                faults0 = minor_faults()
                t0 = time.perf_counter()
                times = time_repeats(lambda: losses.append(lab.train_step(t)), lab.device,
                                     warmup=0, repeats=steps, after_each=tick)
                wall = time.perf_counter() - t0
                faults = minor_faults() - faults0
            cond = conditions.stop(wall)
            used = energy.stop(wall)
        finally:
            peak = meter.stop()
    return Steps(times, losses, peak, meter.source, slowed, used, meter.last, conditions=cond,
                 peak_mem_start_bytes=meter.start_bytes, peak_notes=meter.notes, minor_faults=faults)


TRACED_STEPS = 3   # steps a traced run traces after its timed ones: each part and op, their median


def traced_step(lab, t: Toggles, step_s: float, trace: bool = True, memory: bool = False):
    """``TRACED_STEPS`` more training steps under torch.profiler: (Breakdown or None,
    MemoryTimeline or None); ``step_s``, the untraced step time, gives the profiler's overhead.
    The breakdown is the steps' median part by part and op by op (core.breakdown.median_breakdown:
    what lab.expect carries from a trace is not one sample of a shared machine); the memory
    timeline and the Chrome trace are the first step's (the others traced without the memory
    profiler, their files in a folder removed after)."""
    import pathlib
    import tempfile

    from tunekit.core.breakdown import median_breakdown

    breakdown, timeline = _one_traced_step(lab, t, trace, memory)
    if breakdown is not None and TRACED_STEPS > 1:
        with tempfile.TemporaryDirectory(prefix="tunekit-traced-") as folder:
            more = [_one_traced_step(lab, t, True, False, pathlib.Path(folder))[0] for _ in range(TRACED_STEPS - 1)]
        breakdown = median_breakdown([breakdown, *more])
    if breakdown is not None:
        breakdown.compare_with(step_s)
        breakdown.notes.append(f"{TRACED_STEPS} extra steps after the timed ones; overhead against their median")
    return breakdown, timeline


def _one_traced_step(lab, t: Toggles, trace: bool, memory: bool, folder=None):
    """One more training step under torch.profiler: (Breakdown or None, MemoryTimeline or None)."""
    from tunekit.measure.trace import Tracer

    with deferred_interrupt() as shield:  # the profiler goes on and off whole; the step runs in the gate
        tracer = Tracer(f"lab-{label(t, lab.resolve())}", trace, memory, lab.cuda_index, folder).start()
        losses = []
        try:
            with shield.gate():
                wall = time_repeats(lambda: losses.append(lab.train_step(t)), lab.device, warmup=0,
                                    repeats=1)[0]
        except BaseException:
            tracer.stop(math.nan)
            raise
        breakdown, timeline = tracer.stop(wall)
    _check(losses[0], "the loss of the traced step")
    return breakdown, timeline


def _record(lab, t, warmup, m: Steps, probe, flops_source, notes, snap=None) -> RunResult:
    """The run's RunResult (train.record, the one distributed runs use), added to the log."""
    params = list(lab.model.parameters())
    dtype = t.compute_on(lab.device.type)
    result, lab.peaks[dtype] = run_result(  # a re-check may have raised a calibrated peak
        t, m, probe, lab.adapter, lab.peaks[dtype], lab.device, label=label(t, lab.resolve()),
        warmup=warmup, notes=notes, cuda_index=lab.cuda_index, flops_source=flops_source,
        params_bytes=sum(p.numel() * p.element_size() for p in params),
        grads_bytes=sum(p.numel() * p.element_size() for p in params if p.requires_grad),
        optimizer_bytes=state_bytes(lab.optimizer), model=model_label(lab.model),
        n_params=sum(p.numel() for p in params), guard_s=snap.seconds if snap is not None else None)
    from tunekit.lab.explain import explainer, run_line

    result.explainer = explainer(lab, result)   # tunekit.explain(result): planned by this Lab
    if result.trace is not None:   # planned now, after the steps: an untraced run plans nothing
        result.explained, why = run_line(lab, result)
        result.notes += why
    return lab.log.add(result)


def _failed(lab, t, warmup, reason: str, notes, snap) -> RunResult:
    """A run stopped by a non-finite loss or weight, recorded as failed."""
    return lab.log.add(RunResult.failed(
        t, label(t, lab.resolve()), reason, notes, warmup=warmup, model=model_label(lab.model),
        device=device_label(lab.cuda_index), guard_s=snap.seconds if snap is not None else None))
