"""What a well-written kernel reaches on a device, with the source of each figure: the figures
`core.expected` turns a fake step's ops into an expected step time with. Pure data, no torch.

Nothing here is fitted to the training runs a prediction is judged against (benchmarks/
bench_expected.py): each figure is a microbenchmark or a kernel paper's, named beside it.
A device without a figure gets no expectation for what needs it, and a note naming the figure.
"""
from __future__ import annotations

from dataclasses import dataclass

_MAMF = "ml-engineering compute/accelerator MAMF table (bf16 8192-class matmuls, torch)"

# Maximum achievable matmul TFLOPS (MAMF), dense, by device and dtype: the best a swept matmul
# reached through torch. H200 shares H100's compute (its bf16 is given as the same figure).
MAMF = {
    ("H100 SXM", "bf16"): (794.5, _MAMF), ("H100 SXM", "fp16"): (794.5, _MAMF + ", bf16's figure"),
    ("H100 SXM", "fp8"): (1402.6, _MAMF),
    ("H200 SXM", "bf16"): (794.5, _MAMF + " (H200: the H100's)"), ("H200 SXM", "fp16"): (794.5, _MAMF + ", bf16's"),
    ("H200 SXM", "fp8"): (1453.4, _MAMF),
    ("A100 80GB", "bf16"): (271.2, _MAMF), ("A100 80GB", "fp16"): (271.2, _MAMF + ", bf16's figure"),
    # the 40 GB card has the same GA100 compute (SMs, clocks) as the 80 GB one the table measured
    ("A100 40GB", "bf16"): (271.2, _MAMF + " (the 80 GB card's: same GA100 compute)"),
    ("A100 40GB", "fp16"): (271.2, _MAMF + " (the 80 GB card's bf16)"),
    ("B200", "bf16"): (1745.0, _MAMF), ("B200", "fp16"): (1745.0, _MAMF + ", bf16's figure"),
    ("MI300X", "bf16"): (668.4, _MAMF), ("MI300X", "fp16"): (668.4, _MAMF + ", bf16's figure"),
}

# The share of the memory bandwidth a streaming kernel reaches (bytes read + written over time)
BANDWIDTH_FRACTION = {
    "H100 SXM": (3.0 / 3.35, "device-to-device copies measured on this workplace's lent H100 (facts.md)"),
    "H200 SXM": (4.3 / 4.8, "device-to-device copies measured on this workplace's lent H200 (facts.md)"),
    "A100 80GB": (1.80 / 2.04, "read kernel at 1.80 of 2.04 TB/s on an A100 80GB, NCU agreeing "
                          "(forums.developer.nvidia.com/t/trouble-to-reach-peak-bandwidth-of-a100/339083)"),
}

# Streaming multiprocessors (the waves a tiled matmul fills): vendor data sheets
SMS = {"H100 SXM": 132, "H200 SXM": 132, "H100 PCIe": 114, "H100 NVL": 132, "A100 80GB": 108, "A100 40GB": 108,
       "B200": 148}
TILE = (128, 128)   # a CUTLASS/cuBLAS threadblock tile of a large half-precision GEMM
WAVE_SOURCE = ("wave quantization over 128 x 128 tiles (NVIDIA Deep Learning Performance Guide, Matrix "
               "Multiplication Background)")

# A matmul dimension that is not a multiple of 8 halves leaves tensor-core-friendly kernels: the
# seeds' SwiGLU sweep on an H100 at h=4096 ran d_ff=10922 at 272.7 TFLOPS and 10944 at 398.4
MISALIGNED = (272.7 / 398.4, "SwiGLU d_ff sweep on an H100 (10922: 272.7, 10944: 398.4 TFLOPS; the seeds)")
ALIGN = 8

# Fused attention (forward + backward, causal half counted as the kernels count it), share of the
# dense peak, by backend and device
_FA2 = "FlashAttention-2 README: up to 225 TFLOPS per A100 (72%)"
_FA2_H100 = "FlashAttention-3 paper: FlashAttention-2 reaches ~35% of an H100"
_FA3 = "FlashAttention-3 paper: 740 TFLOPS fp16 (75%) on an H100"
ATTENTION = {
    ("flash", "A100 80GB"): (0.72, _FA2), ("flash", "A100 40GB"): (0.72, _FA2),
    ("flash", "H100 SXM"): (0.35, _FA2_H100), ("flash", "H200 SXM"): (0.35, _FA2_H100),
    ("fa3", "H100 SXM"): (0.75, _FA3), ("fa3", "H200 SXM"): (0.75, _FA3 + " (H200: the H100's)"),
}

# Host time per kernel: eager PyTorch dispatches each op through Python, autograd and the ATen
# dispatcher before the launch (5-25 us together; the low end on a fast host), a compiled graph
# launches its kernels from generated code (cudaLaunchKernel, 1-3 us on CUDA 12)
_LAUNCH = "jiahuanglin.xyz gpu_kernel_serving lesson 18 (from PyTorch op to kernel launch)"
LAUNCH_S = {"eager": (5e-6, _LAUNCH + ": 5-25 us per eager op"),
            "compiled": (3e-6, _LAUNCH + ": cudaLaunchKernel 1-3 us")}

DDP_BUCKET_BYTES = (25 * 2**20, "torch DDP bucket_cap_mb=25 (its default)")


@dataclass(frozen=True)
class Figures:
    """What the expectation needs of one device and dtype (None where unknown)."""

    name: str
    peak_tflops: float | None
    mamf_tflops: float | None
    mamf_source: str
    bandwidth_tbs: float | None       # what streaming kernels reach (the fraction applied)
    bandwidth_source: str
    launch_s: float
    launch_source: str
    host_bound: bool                  # True: the host waits for each kernel (a CPU): launch adds to work
    sms: int | None = None
    attention: dict | None = None     # backend -> (share of peak, source)
    mamf_sweep: tuple = ()            # ((size, tflops), ...): a calibration's sweep (a CPU)
    bandwidth_sweep: tuple = ()       # ((bytes, TB/s), ...): a measured copy sweep (a CPU)
    transcendental_rate: float | None = None   # elements/s of GELU-class ops (a CPU: compute-bound there)

    def missing(self) -> list:
        out = []
        if not self.mamf_tflops:
            out.append("its maximum achievable matmul TFLOPS (MAMF)")
        if not (self.bandwidth_tbs or self.bandwidth_sweep):
            out.append("the memory bandwidth a streaming kernel reaches")
        return out

    def tbs_at(self, nbytes: float) -> float:
        """The bandwidth an op moving ``nbytes`` reaches: the sweep's at the largest size not above
        them (a working set in cache runs faster), else the one figure."""
        if not self.bandwidth_sweep:
            return self.bandwidth_tbs
        below = [t for s, t in self.bandwidth_sweep if s <= nbytes]
        return below[-1] if below else self.bandwidth_sweep[0][1]


# elementwise ops whose transcendentals (tanh, erf, exp) a CPU computes slower than it streams bytes
TRANSCENDENTAL = {"gelu", "gelu_backward", "tanh", "tanh_backward", "exp", "erf", "silu", "silu_backward",
                  "sigmoid", "sigmoid_backward", "_softmax", "_softmax_backward_data", "_log_softmax",
                  "_log_softmax_backward_data"}

# aten ops one optimizer update runs per parameter tensor (torch's single-tensor AdamW: mul, lerp,
# addcmul, sqrt, div, add, addcdiv, ... ; SGD with momentum: mul, add, add) and how many tensors a
# foreach/fused CUDA launch takes (MultiTensorApply.cuh, depth 4: 36 tensors)
OPTIMIZER_OPS = {"adamw": 12, "adamw_fused": 1, "sgd": 3, "sgd_nomomentum": 1}
FOREACH_TENSORS = 36


def gpu_figures(name: str, dtype: str, peak: float | None, bandwidth_tbs: float | None, compiled: bool) -> Figures:
    """A spec-table GPU's figures for ``dtype`` (fp32 matmuls run on the CUDA cores at the peak's share)."""
    mamf, src = MAMF.get((name, dtype), (None, f"no MAMF figure for {name} {dtype}"))
    frac, bsrc = BANDWIDTH_FRACTION.get(name, (None, f"no measured bandwidth fraction for {name}"))
    launch, lsrc = LAUNCH_S["compiled" if compiled else "eager"]
    att = {b: v for (b, dev), v in ATTENTION.items() if dev == name}
    return Figures(name=name, peak_tflops=peak, mamf_tflops=mamf, mamf_source=src,
                   bandwidth_tbs=bandwidth_tbs * frac if (frac and bandwidth_tbs) else None,
                   bandwidth_source=bsrc, launch_s=launch, launch_source=lsrc, host_bound=False,
                   sms=SMS.get(name), attention=att)


def wave_efficiency(m: int, n: int, batch: int, sms: int | None) -> float:
    """The share of the last wave's tiles that do work, for a GEMM whose tiles fill the device at
    least once (smaller ones are split along k by cuBLAS and fill it: 1.0)."""
    if not sms:
        return 1.0
    tiles = -(-m // TILE[0]) * -(-n // TILE[1]) * batch
    if tiles < sms:
        return 1.0
    waves = -(-tiles // sms)
    return tiles / (waves * sms)
