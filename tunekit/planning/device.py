"""The device a plan is placed on: memory, dense peak, bandwidth and fixed costs, from its GPU row
(`core.gpus`, read through `core.specs`) or this machine."""
from __future__ import annotations

from tunekit.core import registry, specs, validate
from tunekit.core.memory.options import CUDA_CONTEXT
from tunekit.core.notes import Note
from tunekit.core.registry import BF16, FP32
from tunekit.core.specs import runs_instead
from tunekit.measure.live import CUDA_BLOCK
from tunekit.planning.shard import NCCL_BUFFERS

# torch's cuBLAS workspace, one per (handle, stream), from its caching allocator
# (aten/src/ATen/cuda/CublasHandlePool.cpp): 32 MiB on compute capability 9.x-12.x
# (":4096:8"), 4096 KiB x 2 + 16 KiB x 8 before; a row's own figure where the rule is not torch's
# CUDA one (hipBLASLt on MI300: its row's blas_workspace)
_CUBLAS = "torch's cuBLAS workspace for one stream (CublasHandlePool.cpp)"
WORKSPACE_FROM_HOPPER = 32 * 2**20
WORKSPACE_BEFORE_HOPPER = 4096 * 1024 * 2 + 16 * 1024 * 8


def workspace_bytes(gpu) -> float:
    """One BLAS workspace on ``gpu`` (a `core.gpu.GPU` row), by torch's rule or the row's figure."""
    if gpu.blas_workspace is not None:
        return gpu.blas_workspace.value
    cc = gpu.capability.value if gpu.capability is not None else (0, 0)
    return WORKSPACE_FROM_HOPPER if (9, 0) <= tuple(cc) < (13, 0) else WORKSPACE_BEFORE_HOPPER


def device_figures(name, precision, world_size: int = 1) -> dict:
    """What a plan needs of a device: its name, memory (bytes torch can use), dense peak for the
    precision (TFLOPS), memory bandwidth (TB/s), link (GB/s each way), CUDA allocator rounding,
    and the fixed costs beside the model (bytes, source)."""
    validate.text("device", name)
    dtype = precision
    if name.strip().lower() == "cpu":
        import psutil

        from tunekit.measure.peaks import calibrate, resolve_peak

        dtype = dtype if dtype in (FP32, BF16) else FP32   # the dtypes a CPU is calibrated in
        calibrate(dtype, "cpu")   # the cached calibration as it is (measured where none is), never re-measured
        peak = resolve_peak("cpu", dtype, allow_calibration=False)
        return dict(name="cpu", memory=float(psutil.virtual_memory().total), peak=peak.tflops, bandwidth=None,
                    link=None, round_to=1, fixed={},
                    notes=[f"peak {peak.source}; no memory bandwidth known for this CPU: the bound counts FLOPs only"])
    spec = specs.card(name)   # a memory size in the name that the card lacks is refused there
    if spec.memory_gb is None:
        raise ValueError(f"the spec table has no memory size for {spec.name}: plan for another device")
    notes = [] if spec.bandwidth_tbs else [f"no memory bandwidth listed for {spec.name}: the bound counts FLOPs only"]
    if name.strip().lower() != spec.name.lower():   # an alias or a driver's name: say which card it was read as
        others = [n for n in specs.names() if n != spec.name and n.split()[0] == spec.name.split()[0]]
        notes.append(f"device {name!r} read as {spec.name}" + (f" (the table also has {', '.join(others)}: name "
                                                                  "it to plan for it)" if others else ""))
    memory, memory_source = spec.usable
    peak = spec.tflops.get(dtype)
    if peak is None:   # no bound at all: one from another dtype's peak or from the bytes alone would be a guess
        instead = runs_instead(spec, dtype)
        notes.append(Note("device.no_peak", f"{spec.name} lists no {dtype} peak: no speed bound, no expected step"
                          + (f"; {spec.name} has {instead[1]}" if instead else "")))
    workspace = workspace_bytes(spec)
    if spec.platform == "rocm":   # ROCm: the same costs under HIP's names, CUDA's figure for the context
        fixed = {"hip_context": (CUDA_CONTEXT[0], "HIP context: CUDA's figure (none published for ROCm)"),
                 "hipblaslt_workspace": (float(workspace), _CUBLAS.replace("cuBLAS", "hipBLASLt"))}
        if world_size > 1:
            fixed["rccl_buffers"] = (NCCL_BUFFERS[0], "RCCL buffers: NCCL's figure")
    else:
        fixed = {"cuda_context": CUDA_CONTEXT, "cublas_workspace": (float(workspace), _CUBLAS)}
        if world_size > 1:
            fixed["nccl_buffers"] = NCCL_BUFFERS
    return dict(name=spec.name, memory=memory, peak=peak, bandwidth=spec.bandwidth_tbs,
                link=spec.link_gbs, round_to=CUDA_BLOCK, fixed=fixed,
                notes=notes + [f"peak: {spec.source}; memory: {memory_source}"])


def compute_note(s) -> list:
    """Why the bound of Setting ``s`` is against another dtype's peak than ``precision`` names: half weights."""
    if s.compute == s.precision:
        return []
    if registry.PRECISIONS[s.precision].autocast_dtype is None:
        return [f"weights are {s.weights}: the matmuls run in {s.weights}, so the bound is against the {s.weights} "
                f"peak (precision={s.precision!r} names the autocast, here none)"]
    return [f"weights are {s.weights}: the matmuls run in {s.weights} (autocast to {s.precision} is not applied "
            f"to half weights), so the bound is against the {s.weights} peak"]
