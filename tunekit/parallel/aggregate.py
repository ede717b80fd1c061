"""Rank 0's one RunResult of a distributed run, from every rank's figures.

    >>> result = aggregate(spec, rank, gathered, losses, warmup, first_step_at, meter.source, device)

A step ends when its slowest rank ends; memory and bytes are the largest rank's; the collectives
are those counted on rank 0 against what tunekit.core.comm expects; the machine's conditions one
verdict over the ranks. The record itself is ``train.record.run_result``, the Lab's.
"""
from __future__ import annotations

import math

from tunekit.core.comm import total_by
from tunekit.core.conditions import combine
from tunekit.core.results import RunResult
from tunekit.core.toggles import Toggles, label
from tunekit.measure.conditions import judge_rank
from tunekit.measure.peaks import Peak, resolve_peak
from tunekit.train.record import Steps, run_result

NO_WAIT = ("not measured: the collectives run asynchronously on the backend's own threads and "
           "torch exposes no per-collective wait time without a profiler trace")


def _comm_record(rank, gathered, notes, warmup) -> dict | None:
    """The collectives of the one step rank 0 counted, against what core.comm expects."""
    tables = gathered[0]["comm"]
    if not tables:
        notes.append("communication not counted (comm=False)")
        return None
    mean = tables[0]
    step = gathered[0]["counted"][0]
    if step > warmup:
        notes.append("collectives counted on the first timed step (no warm-up): its time includes "
                     "the counter's cost")
    if rank.parallel == "ddp" and step == 2:
        notes.append("comm counted DDP's second iteration, which also broadcasts its rebuilt bucket "
                     "order once (a few bytes); warm up 3 steps to count a steady one")
    agree = all(g["comm"] == tables for g in gathered)
    return {"per_step": mean, "by_kind": total_by(mean, "kind"), "by_scope": total_by(mean, "scope"),
            "expected": rank.expected_comm(), "other_ops": gathered[0]["other"],
            "ranks_agree": agree, "rank": 0, "step_counted": step,
            "convention": "bytes: all_gather its gathered output, reduce_scatter its input, "
                          "all_reduce and broadcast their buffer; one optimizer step (step_counted, "
                          "1-based, warm-up included), on rank 0"}


def _peak(spec, device, dtype: str) -> Peak:
    """The peak the Lab sent (it re-checks it when the run is back), else this machine's."""
    if spec.get("peak_tflops") is None:
        return resolve_peak(device, dtype)
    tflops = spec["peak_tflops"]
    source = spec.get("peak_tflops_source") or spec.get("peak_source")  # its name in earlier specs
    return Peak(tflops, source or f"given: {tflops} TFLOPS", spec.get("peak_kind", "given"))


def aggregate(spec, rank, gathered, losses, warmup, first_step_at, meter_source, device) -> RunResult:
    """The run's RunResult: ``rank`` is rank 0's ``worker.Rank``, ``gathered`` every rank's figures
    (times, peak memory, comm tables, conditions, local bytes), ``losses`` the global batch's loss
    per step (warm-up included)."""
    t, world = rank.t, rank.world
    steps = len(gathered[0]["times"])
    # a step ends when its slowest rank ends: the max over ranks of each step's time
    per_step = [max(g["times"][i] for g in gathered) for i in range(steps)]
    peaks = [g["peak"] for g in gathered]
    kind = spec["parallel"] or "one process"
    notes = [f"{kind} over {rank.nodes} node(s) x {rank.nproc} rank(s); "
             f"global batch {t.micro_batch * world} x grad_accum {t.grad_accum}",
             f"comm_wait_s {NO_WAIT}"]
    launched = spec.get("launched_at")
    comm = _comm_record(rank, gathered, notes, warmup)
    notes.append("params/grads/optimizer bytes: the largest rank's local shards")
    if launched is None:
        notes.append("launch_s unknown: the job was started outside tunekit.parallel.launch")
    else:
        joined, group = spec.get("_joined_at", launched), spec.get("_group_at", launched)
        notes.append(f"launch to first step {first_step_at - launched:.1f} s: {joined - launched:.1f} s "
                     f"to start the ranks (interpreters, torch import), {group - joined:.1f} s rendezvous "
                     f"and process group, {first_step_at - group:.1f} s model, FLOP count and sharding")
    failed = {} if all(math.isfinite(v) for v in losses) else {"status": "failed", "error": "a loss was not finite"}
    m = Steps(per_step, losses, None if None in peaks else max(peaks), meter_source,
              conditions=ranks_conditions([g["conditions"] for g in gathered]))
    # no matmul re-checks a calibrated peak here: the Lab does once the run is back
    result, _ = run_result(
        t, m, rank.probe, rank.adapter, _peak(spec, device, t.compute_on(device.type)), device,
        label=(f"{spec['parallel']} {rank.nodes}x{rank.nproc} " if spec["parallel"] else "") + label(t, Toggles()),
        warmup=warmup,
        notes=notes, cuda_index=device.index if device.type == "cuda" else None, world=world, recheck=False,
        params_bytes=max(g["params_bytes"] for g in gathered), grads_bytes=max(g["grads_bytes"] for g in gathered),
        optimizer_bytes=max(g["optimizer_bytes"] for g in gathered), model=rank.model_name,
        n_params=rank.n_params, world_size=world, parallel=spec["parallel"], nodes=rank.nodes,
        peak_mem_bytes_per_rank=peaks, comm=comm, comm_wait_s=None,
        launch_s=None if launched is None else first_step_at - launched, losses=losses, **failed)
    return result


def ranks_conditions(readings: list):
    """One verdict over the ranks: each judged with the CPU time of all the run's ranks on its
    machine taken out of 'other processes' (the ranks' windows are the same timed steps)."""
    group = {}
    for r in readings:
        group[r["host"]] = group.get(r["host"], 0.0) + r["raw"]["own_cpu_s"]
    return combine([judge_rank(r, group[r["host"]]) for r in readings],
                   [f"rank {i}" for i in range(len(readings))])
