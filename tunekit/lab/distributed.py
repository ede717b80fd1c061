"""A ``lab.run(parallel=...)``: the Lab's model, weights and toggles sent to worker processes
(parallel), and their RunResult measured against the Lab's peak.

    >>> result = run_distributed(lab, 10, 1, None, setting_of(lab, layout=("fsdp", 2, 1)), link=None)

Everything that cannot travel to a worker (a batch_fn, a loss_fn, data as bytes, blocks as
modules) and every size that cannot fit is refused before any rank starts. The Lab's own model
is not changed: the workers start from a copy of its weights.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from tunekit.core.results import RunResult
from tunekit.core.setting import Setting
from tunekit.core.toggles import ToggleError, label, normalized
from tunekit.lab import fit
from tunekit.measure.peaks import rates


def problems(lab, t, steps, warmup, parallel, nproc, nodes) -> list[str]:
    """Why this Lab cannot run ``t`` distributed (empty: it can)."""
    from tunekit.core.comm import layout_problems

    errors = layout_problems(parallel, nproc, nodes) + lab.check(t, steps, warmup)
    if lab.batcher is None:
        errors.append("a distributed run draws its batches in the workers: a Lab with its own "
                      "batch_fn cannot run one (use the built-in data, or train with torchrun)")
    if lab.loss_fn != lab.adapter.loss:
        errors.append("a loss_fn cannot travel to worker processes: a distributed run uses the "
                      "model's own loss")
    if not isinstance(lab.data, str):
        errors.append("a distributed run draws 'corpus' or 'synthetic' data in the workers; "
                      "data given as bytes or a tensor cannot travel to them")
    if lab.blocks is not None and not isinstance(lab.blocks, str):
        errors.append("blocks given as modules cannot travel to worker processes: name them by "
                      "attribute path, e.g. Lab(model, blocks='layers')")
    return errors


def run_distributed(lab, steps, warmup, progress, s: Setting, link) -> RunResult:
    """``lab.run(parallel=...)`` (see its docstring) of the Setting ``s`` made at its edge: its
    toggles over ``s.nodes`` x ``s.world_size // s.nodes`` ranks, launched by parallel.launch, each
    from the Lab's weights; the run is added to the Lab's log."""
    from tunekit.models.spec import factory_spec, model_spec
    from tunekit.parallel.launch import launch

    t, parallel, nodes = s.toggles, s.parallel, s.nodes
    nproc = s.world_size // nodes
    errors = problems(lab, t, steps, warmup, parallel, nproc, nodes)
    spec_model = None
    try:
        spec_model = factory_spec(lab.factory) if lab.factory else model_spec(lab.model)
    except ValueError as e:
        errors.insert(0, str(e))
    if errors:
        raise ToggleError(errors)
    t = normalized(t)
    fit.check_distributed(lab, t, parallel, nproc, nodes)  # before any rank starts
    lab.log.check_writable()
    dtype = t.compute_on(lab.device.type)
    peak = lab.peaks[dtype]
    with tempfile.TemporaryDirectory(prefix="tunekit-weights-") as tmp:
        weights = Path(tmp) / "weights.pt"
        torch.save(getattr(lab.model, "_orig_mod", lab.model).state_dict(), weights)
        spec = {"model": spec_model, "parallel": parallel, "toggles": t.asdict(),
                "steps": int(steps), "warmup": int(warmup), "seed": lab.seed, "data": lab.data,
                "weights": str(weights), "peak_tflops": peak.tflops, "peak_tflops_source": peak.source,
                "peak_kind": peak.kind, "device": lab.device.type,
                **({"blocks": lab.blocks} if lab.blocks else {})}
        result = launch(spec, nproc, nodes=nodes, link=link, progress=progress)
    result.label = f"{parallel} {nodes}x{nproc} {label(t, lab.resolve())}"
    recheck_rates(lab, result, peak, dtype)
    return lab.log.add(result)


def recheck_rates(lab, result: RunResult, peak, dtype: str) -> None:
    """The ranks took ``peak`` as it was sent: a calibrated one is re-checked now they are done, and
    the result's MFU/HFU and peak follow it (a local distributed run's and a cluster job's)."""
    r = rates(result.flops_per_step, result.model_flops_per_step, result.step_s, peak, lab.device, dtype,
              devices=result.world_size or 1)
    lab.peaks[dtype] = r.peak
    result.mfu, result.hfu, result.above_peak = r.mfu, r.hfu, r.above_peak
    result.peak_tflops, result.peak_tflops_source = r.peak.tflops, r.peak.source
