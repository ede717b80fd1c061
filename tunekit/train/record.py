"""A RunResult from the timed steps of one run: the Lab's, or every rank's of a distributed one.

    >>> m = Steps(times, losses, peak_mem_bytes, meter.source, slowed=False)
    >>> result, peak = run_result(t, m, probe, adapter, peak, device, label=..., warmup=2, notes=[])

Tokens, FLOPs per step (the untimed probe's count, times ``grad_accum`` and the ranks), model
FLOPs in tunekit's one MFU convention (the adapter's), and TFLOPS/MFU/HFU from
``measure.peaks.rates``, the one place they are computed.
"""
from __future__ import annotations

import math
import resource
import statistics
import time
from dataclasses import dataclass

from tunekit.core import registry
from tunekit.core.notes import Note
from tunekit.core.results import RunResult
from tunekit.core.toggles import Toggles
from tunekit.measure.conditions_gomp import policy
from tunekit.measure.device import device_label
from tunekit.measure.energy import Energy
from tunekit.measure.peaks import Peak, rates, resolve_peak


@dataclass
class Steps:
    """What the timed steps of one run measured."""

    times: list             # seconds per step, device synchronized (distributed: the slowest rank's)
    losses: list            # loss per step, warm-up included: tensors (read after the clock) or floats
    peak_mem_bytes: float | None
    peak_mem_source: str    # the meter that read it
    slowed: bool = False    # timed under an outer FLOP counter: no rates from this clock
    energy: Energy | None = None      # over the timed steps
    alloc: dict | None = None         # CUDA allocator retries / OOMs over the timed steps
    trace: object = None              # Breakdown of one extra traced step (run(trace=True))
    memory: object = None             # MemoryTimeline of it (run(memory=True))
    conditions: object = None         # core.conditions.Conditions over the timed steps
    peak_mem_start_bytes: float | None = None   # the meter's reading at the start (DeviceMeter.start_bytes)
    peak_notes: list | None = None    # what makes the peak less sure (DeviceMeter.notes)
    minor_faults: int | None = None   # the process's minor page faults over the timed steps (measure.meters)


class Peaks(dict):
    """The peak each compute dtype's MFU is measured against (dtype -> measure.peaks.Peak),
    resolved at first use; a run whose re-check raised a calibrated peak stores the new one."""

    def __init__(self, device, given: float | None = None):
        super().__init__()
        self.device, self.given = device, given

    def __missing__(self, dtype: str) -> Peak:
        self[dtype] = resolve_peak(self.device, dtype, given=self.given)
        return self[dtype]


def iqr(times) -> float:
    """The interquartile range of ``times`` (seconds; quartiles as ``statistics.quantiles``'
    "inclusive" method reads them: 0 for one time). Example: ``iqr([1, 2, 3, 4, 5]) == 2.0``."""
    if len(times) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return q3 - q1


# a minor page fault's cost on the 2-vCPU CI machine: 1.0-1.5 us (benchmarks/bench_mb_growth.py,
# RESULTS.md "The morning session"); the lower end, so a note never overstates the share
FAULT_S = 1.0e-6
FAULT_SHARE = 0.01   # a note when the timed steps' faults cost this share of the step or more
# glibc's tunables (mallopt(3)) that keep freed heap pages: the largest mmap threshold glibc takes
# on 64-bit (32 MiB, DEFAULT_MMAP_THRESHOLD_MAX in glibc's malloc/malloc.c), so tensors below it come
# from the heap, and a trim threshold (1 GiB) no step's freed top reaches: free() hands nothing back
TUNABLES = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "1073741824"}


def fault_notes(faults_per_step: float, step_s: float, page_bytes: int) -> list:
    """A ``measure.page_faults`` note when the timed steps' minor page faults, at ``FAULT_S`` each,
    are ``FAULT_SHARE`` of the step or more: mostly glibc handing heap pages back at a free (its trim
    threshold) that the next step faults in again, zeroed by the kernel. E.g. 4,162 faults a step of
    4 KiB pages in a 36 ms step: 16.3 MiB, 4.16 ms, 11.6% (said ~12%) -> a note. A CPU run's only:
    ``run_result`` asks it for no other device."""
    share = faults_per_step * FAULT_S / step_s if step_s > 0 else math.nan
    if not share >= FAULT_SHARE:
        return []
    return [Note("measure.page_faults", f"the timed steps faulted in {faults_per_step * page_bytes / 2**20:.1f} MiB "
                 f"of fresh pages per step ({faults_per_step:,.0f} page faults, ~{share:.0%} of the step at "
                 f"~{FAULT_S * 1e6:.0f} us each): part of the step is the kernel zeroing pages, most often a heap "
                 f"the allocator trimmed and grows again; {tunables_words()} in the environment keeps glibc's")]


def tunables_words() -> str:
    return " ".join(f"{k}={v}" for k, v in TUNABLES.items())


def run_result(t: Toggles, m: Steps, probe, adapter, peak: Peak, device, *, label: str, warmup: int,
               notes: list, cuda_index: int | None = None, world: int = 1, flops_source: str = "counted",
               recheck: bool = True, **fields) -> tuple[RunResult, Peak]:
    """The RunResult of ``m``, timed under ``t`` on ``world`` ranks of ``device`` (each with its
    ``t.micro_batch``), and the peak its MFU is measured against (a calibrated one re-checked
    unless ``recheck=False``). ``probe``: the untimed step's count (measure.step.ProbeResult)
    of one micro-batch on one rank, None when not counted. ``fields``: the rest of the record
    (bytes of parameters, gradients and optimizer state, model name, distributed figures...)."""
    step_s = sum(m.times) / len(m.times)
    per_sample = probe.per_sample if probe is not None else t.seq_len
    tokens = t.micro_batch * t.grad_accum * per_sample * world
    # what was counted: tokens, or samples where the batch has no sequence dimension (views say samples/s)
    unit = probe.unit if probe is not None else "tokens"
    if unit == "samples" and t.seq_len != 1:
        notes.append(f"the batch has no sequence dimension of seq_len={t.seq_len}: throughput counts samples")
    counts = probe is not None and bool(probe.flops.executed)
    executed = probe.flops.executed * t.grad_accum * world if counts else None
    counted = probe.flops.model * t.grad_accum * world if counts else None
    model_flops, convention, why = adapter.model_flops(t.seq_len, tokens, counted)
    notes.extend(why)
    if m.slowed:
        notes.append(Note("rates.none", "timed under an outer FLOP counter (a first %%gpuprofile run?): "
                          "step times are slowed by it, so no TFLOPS/MFU; re-run for clean speeds"))
    dtype = t.compute_on(device.type)
    rate_s = math.nan if m.slowed else step_s  # rates from a counter-slowed clock would lie
    r = rates(executed, model_flops, rate_s, peak, device, dtype, devices=world, recheck=recheck)
    values = [float(v) for v in m.losses]  # after the clock: .item() would sync mid-run
    ac = t.autocast
    result = RunResult(
        run_id=None, label=label, toggles=t.toggles,
        steps=len(m.times), warmup=warmup, tokens_per_step=tokens, tokens_per_s=tokens / step_s,
        step_s=step_s, step_s_min=min(m.times), step_s_max=max(m.times),
        step_s_median=statistics.median(m.times), step_s_iqr=iqr(m.times),
        flops_per_step=executed, model_flops_per_step=model_flops,
        flops_source=flops_source if executed is not None else "none",
        tflops=r.tflops, mfu=r.mfu, hfu=r.hfu, above_peak=r.above_peak,
        peak_tflops=r.peak.tflops, peak_tflops_source=r.peak.source,
        peak_mem_bytes=m.peak_mem_bytes, peak_mem_source=m.peak_mem_source,
        peak_mem_start_bytes=m.peak_mem_start_bytes,
        minor_faults_per_step=None if m.minor_faults is None else m.minor_faults / len(m.times),
        mfu_convention=convention,
        saved_bytes=probe.saved_bytes if probe is not None else None,
        weight_cast_bytes=probe.cast_bytes if probe is not None else None,
        loss=values[-1], loss_first=values[0], device=device_label(cuda_index),
        attention_ran=probe.attention_ran if probe is not None else adapter.attention_ran,
        compute_dtype=dtype, autocast_dtype=registry.dtype(ac).torch_name if ac else None,
        time=time.strftime("%Y-%m-%dT%H:%M:%S"),
        notes=notes + (m.peak_notes or []) + (probe.notes if probe is not None else []),
        trace=m.trace, memory=m.memory, conditions=m.conditions, throughput_unit=unit,
        wait_policy=policy() if device.type == "cpu" else None, **fields)   # what this process's libgomp read
    if m.energy is not None:
        e = m.energy
        result.energy_j, result.energy_source, result.mean_w = e.joules, e.source, e.mean_w
        result.j_per_token = e.joules / (tokens * len(m.times))
        result.notes.extend([e.note] if e.note else [])
    # a CPU step's cost only: on a GPU the host's faults overlap the device's kernels, not the step
    if m.minor_faults is not None and device.type == "cpu":
        result.notes.extend(fault_notes(m.minor_faults / len(m.times), step_s, resource.getpagesize()))
    alloc = m.alloc or {}
    result.gpu_alloc_retries, result.gpu_ooms = alloc.get("gpu_alloc_retries"), alloc.get("gpu_ooms")
    return result, r.peak
