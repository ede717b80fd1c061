"""A ``lab.run(..., on=tunekit.Slurm(...))``: the Lab's model, weights and toggles sent to a cluster
job (tunekit.parallel.slurm), and the job's RunResult in the Lab's log, where it ran said.

    >>> result = run_on(lab, tunekit.Slurm(partition="gpu", gpus_per_node=8), 20, 2, None, "fsdp", {})

Everything a local distributed run refuses is refused here too, and what the cluster cannot take
(no sbatch, an unknown partition, more nodes or GPUs than it has, a time limit shorter than the
run) before anything is submitted. The job's folder (spec, weights, script, progress, result,
logs) stays for the record. A job that ends without a result is a failed run in the log, its
cause in words and the steps it measured kept, and the JobFailed goes on to the caller.
"""
from __future__ import annotations

import statistics

import torch

from tunekit.core.results import RunResult
from tunekit.core.toggles import ToggleError, label, normalized
from tunekit.lab import fit
from tunekit.lab.distributed import problems
from tunekit.measure.peaks import rates


def submitted(lab, target, steps, warmup, progress, parallel, changes, verbose, local_layout) -> RunResult:
    """``lab.run(on=target)``'s checks and display, then `run_on`. ``local_layout``: the call also
    gave nproc/nodes/link/trace/memory, which a cluster run takes from its target or cannot do."""
    from tunekit.core.validate import flag

    if local_layout:
        raise ToggleError(["on=... takes its layout from the target (nodes, gpus_per_node or "
                           "ntasks_per_node): leave nproc, nodes, link, trace and memory out"])
    if not hasattr(target, "submit"):
        raise ToggleError([f"on= is a cluster target such as tunekit.Slurm(partition=...), got {target!r}"])
    if not flag("verbose", verbose):
        return run_on(lab, target, steps, warmup, progress, parallel, changes)
    from tunekit.view.progress import RunProgress

    with RunProgress(steps, progress) as shown:
        shown.result = run_on(lab, target, steps, warmup, shown.tick, parallel, changes)
    return shown.result


def run_on(lab, target, steps, warmup, progress, parallel, changes, on_state=None) -> RunResult:
    """``lab.run(on=target)`` (see its docstring): ``target.nodes`` x its ranks per node, each from
    the Lab's weights; ``on_state(state, info)`` on each change of the job's state (default: one
    line per change, printed)."""
    from tunekit.models.spec import factory_spec, model_spec
    from tunekit.parallel.slurm import JobFailed, job_folder

    nproc, nodes = target.ranks_per_node, target.nodes
    t = lab.resolve(**changes)
    if nproc * nodes == 1 and parallel is None:
        errors = lab.check(t, steps, warmup)
    else:
        errors = problems(lab, t, steps, warmup, parallel, nproc, nodes)
    try:
        spec_model = factory_spec(lab.factory) if lab.factory else model_spec(lab.model)
    except ValueError as e:
        errors.insert(0, str(e))
    errors += target.check()
    if errors:
        raise ToggleError(errors)
    t = normalized(t)
    if parallel is not None:
        fit.check_distributed(lab, t, parallel, nproc, nodes)  # before anything is submitted
    lab.log.check_writable()
    dtype = t.compute_on(lab.device.type)
    peak = lab.peaks[dtype]
    folder = job_folder(target, "run")
    torch.save(getattr(lab.model, "_orig_mod", lab.model).state_dict(), folder / "weights.pt")
    spec = {"model": spec_model, "parallel": parallel, "toggles": t.asdict(), "steps": int(steps),
            "warmup": int(warmup), "seed": lab.seed, "data": lab.data, "weights": str(folder / "weights.pt"),
            "peak_tflops": peak.tflops, "peak_tflops_source": peak.source, "peak_kind": peak.kind,
            "device": "cuda" if target.gpus_per_node else "cpu", **({"blocks": lab.blocks} if lab.blocks else {})}
    where = f"{parallel + ' ' if parallel else ''}{nodes}x{nproc}"
    job = target.submit(spec, folder, name="tunekit-run")
    try:
        result = job.wait(progress=progress, on_state=on_state or _say)
    except JobFailed as e:
        times = e.step_s
        fields = {"job": e.job, "world_size": nproc * nodes, "parallel": parallel, "nodes": nodes}
        if times:   # the steps measured before the end, kept
            fields.update(step_s=statistics.fmean(times), step_s_min=min(times), step_s_max=max(times))
        lab.log.add(RunResult.failed(t, f"{where} {label(t, lab.resolve())} (slurm job {job.job_id})", e.cause,
                                     [f"{len(times)} of {steps} timed steps measured before the job ended"],
                                     **fields))
        raise
    result.label = f"{where} {label(t, lab.resolve())}"
    # the ranks took the peak as it was sent: a calibrated one is re-checked now they are done
    if lab.device.type == spec["device"]:
        r = rates(result.flops_per_step, result.model_flops_per_step, result.step_s, peak, lab.device, dtype,
                  devices=result.world_size or 1)
        lab.peaks[dtype] = r.peak
        result.mfu, result.hfu, result.above_peak = r.mfu, r.hfu, r.above_peak
        result.peak_tflops, result.peak_tflops_source = r.peak.tflops, r.peak.source
    return lab.log.add(result)


def _say(state: str, info: dict) -> None:
    """One line per change of the job's state: pending with its reason, running on its nodes."""
    reason = info.get("Reason")
    said = {"PENDING": f"pending ({reason})" if reason and reason != "None" else "pending",
            "RUNNING": f"running on {info.get('NodeList')}"}.get(state, state.lower())
    job = info.get("JobId", "?")
    print(f"slurm job {job}: {said}", flush=True)   # output, not a warning: a notebook shows it plainly

