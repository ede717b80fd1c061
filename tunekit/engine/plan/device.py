"""The device a plan is placed on: memory, dense peak, bandwidth and fixed costs, from the spec
table (`core.specs`) or this machine. Engine layer."""
from __future__ import annotations

from ...core import validate
from ...core.specs import SPECS, find_spec

CUDA_CONTEXT = (0.47 * 2**30, "CUDA context, lazy loading (torch 2.1 on an A100, ml-engineering)")


def device_figures(name, precision) -> dict:
    validate.text("device", name)
    dtype = "fp32" if precision == "fp32" else precision
    if name.strip().lower() == "cpu":
        import psutil

        from ...measure.peaks import resolve_peak

        peak = resolve_peak("cpu", dtype if dtype in ("fp32", "bf16") else "fp32")
        return dict(name="cpu", memory=float(psutil.virtual_memory().total), peak=peak.tflops, bandwidth=None,
                    fixed={}, notes=[f"peak {peak.source}; no memory bandwidth known for this CPU: the bound "
                                     "counts FLOPs only"])
    spec = find_spec(name)
    if spec is None:
        raise ValueError(f"unknown device {name!r}: one of {', '.join(s.name for s in SPECS)}, or 'cpu'")
    if spec.memory_gb is None:
        raise ValueError(f"the spec table has no memory size for {spec.name}: plan for another device")
    notes = [] if spec.bandwidth_tbs else [f"no memory bandwidth listed for {spec.name}: the bound counts FLOPs only"]
    peak = spec.tflops.get(dtype)
    if peak is None:
        notes.append(f"{spec.name} lists no {dtype} peak: no speed bound")
    # vendors' "80 GB" is what torch sees as ~79 GiB: 80 x 2^30 x 0.99 (an H100 80GB reports 85.0e9 bytes)
    return dict(name=spec.name, memory=spec.memory_gb * 2**30 * 0.99, peak=peak, bandwidth=spec.bandwidth_tbs,
                fixed={"cuda_context": CUDA_CONTEXT}, notes=notes + [f"peak and memory: {spec.source}"])
