"""What a well-written kernel reaches on a device, with the source of each figure: the figures
`core.expected` turns a fake step's ops into an expected step time with. A GPU's own figures (MAMF,
the share of its bandwidth a streaming kernel reaches, SMs, fused attention's share) are its row's
(core.gpus); here are the rules that read them and the figures that belong to no one card. Pure, no torch.

Nothing here is fitted to the training runs a prediction is judged against (benchmarks/
bench_expected.py): each figure is a microbenchmark or a kernel paper's, named beside it.
A device without a figure gets no expectation for what needs it, and a note naming the figure.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from tunekit.core import specs
from tunekit.core.gpu import ATTENTION_KERNELS, attention_share  # noqa: F401  (read from here by planning, expected)

TILE = (128, 128)   # a CUTLASS/cuBLAS threadblock tile of a large half-precision GEMM
WAVE_SOURCE = ("wave quantization over 128 x 128 tiles (NVIDIA Deep Learning Performance Guide, Matrix "
               "Multiplication Background)")

# A matmul dimension that is not a multiple of 8 halves leaves tensor-core-friendly kernels: the
# SwiGLU sweep of stas00/ml-engineering on an H100 at h=4096 ran d_ff=10922 at 272.7 TFLOPS and 10944 at 398.4
MISALIGNED = (272.7 / 398.4, "SwiGLU d_ff sweep on an H100, h=4096 (10922: 272.7, 10944: 398.4 TFLOPS; "
                             "stas00/ml-engineering training/performance/README.md, SwiGLU-based MLP)")
ALIGN = 8

# Host time per kernel: eager PyTorch dispatches each op through Python, autograd and the ATen
# dispatcher before the launch (5-25 us together; the low end on a fast host), a compiled graph
# launches its kernels from generated code (cudaLaunchKernel, 1-3 us on CUDA 12)
_LAUNCH = "jiahuanglin.xyz gpu_kernel_serving lesson 18 (from PyTorch op to kernel launch)"
LAUNCH_S = {"eager": (5e-6, _LAUNCH + ": 5-25 us per eager op"),
            "compiled": (3e-6, _LAUNCH + ": cudaLaunchKernel 1-3 us")}

DDP_BUCKET_BYTES = (25 * 2**20, "torch DDP bucket_cap_mb=25 (its default)")

# Compute that runs while a collective is in flight is slower than alone (NCCL's kernels hold SMs,
# shared memory and HBM bandwidth): measured on 4 A100s, H100s, MI250s and MI210s training GPT and
# LLaMA models, "an average computational slowdown of 18.9%, with a maximum of 40.0%" (the mean taken)
OVERLAP_SLOWDOWN = (0.189, "compute overlapped with communication: 18.9% slower on average, 40.0% at most "
                           "(Characterizing Compute-Communication Overlap, arXiv 2507.03114, A100/H100/MI250/MI210)")


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
    attention: dict | None = None     # backend -> (rows (head_dim, seq, share), source): attention_share
    mamf_sweep: tuple = ()            # ((size, tflops), ...): a calibration's sweep (a CPU)
    bandwidth_sweep: tuple = ()       # ((bytes an op moves, TB/s), ...): its inputs in cache (a CPU, measured)
    cold_sweep: tuple = ()            # the same for ops that read what was written long before (a CPU)
    cold_source: str = ""
    cache_bytes: float | None = None  # the last-level cache: a tensor touched longer ago is read cold
    transcendental_rate: float | None = None   # elements/s of GELU-class ops (a CPU: compute-bound there)
    rng_rate: float | None = None     # elements/s of dropout's random fill (`RNG` ops; a CPU: compute-bound)
    rng_source: str = ""
    view_s: float | None = None       # host time of an op that makes no kernel (a view); None: not counted
    module_s: float | None = None     # host time of an nn.Module call around its forward
    host_source: str = ""
    checkpoint_s: tuple | None = None  # (per checkpointed segment, per saved tensor): torch's checkpoint's own time
    checkpoint_source: str = ""
    # ((layout, tokens, features, tflops), ...): a linear layer's matmuls measured by shape class (a CPU)
    matmul_shapes: tuple = ()
    shape_source: str = ""
    warm_sweep: tuple = ()            # like cold_sweep, for ops reading what a core's L2 lost but the L3 holds
    warm_source: str = ""
    l2_bytes: float | None = None     # a core's L2: a tensor touched longer ago (and nearer than cache_bytes) is warm
    gemm_tflops: float | None = None  # a GPU's matmuls at transformer training shapes (its row's `gemm`); None: MAMF
    gemm_source: str = ""
    busy: tuple = ()                  # the calibrations these figures come from that were taken on a busy machine
    borrowed: tuple = ()              # words: which figure came from which measured card, and why that one

    def missing(self) -> list:
        out = []
        if not self.mamf_tflops:
            out.append("its maximum achievable matmul TFLOPS (MAMF)")
        if not (self.bandwidth_tbs or self.bandwidth_sweep):
            out.append("the memory bandwidth a streaming kernel reaches")
        return out

    def tbs_at(self, nbytes: float, cold: bool = False, warm: bool = False) -> float:
        """The bandwidth an op moving ``nbytes`` reaches: a CPU's sweep read between its sizes in
        log-log (`log_interpolated`), else the one figure. ``cold``: an op reading a tensor written
        long before (a backward's, an optimizer's), where such a sweep was measured: never faster
        than the same op with its inputs in cache (a read from memory cannot beat one from cache).
        ``warm``: one reading a tensor from the last-level cache (`warm_sweep`), the same way."""
        if not self.bandwidth_sweep:
            return self.bandwidth_tbs
        hot = log_interpolated(self.bandwidth_sweep, nbytes)
        if cold and self.cold_sweep:
            return min(hot, log_interpolated(self.cold_sweep, nbytes))
        return min(hot, log_interpolated(self.warm_sweep, nbytes)) if warm and self.warm_sweep else hot

    def shape_tflops(self, layout: str, tokens: float, features: float) -> float | None:
        """The TFLOPS of a linear layer's matmul in ``layout`` at ``tokens`` by ``features`` from
        `matmul_shapes` (`grid_interpolated`); None where its layout was not measured or the shape
        lies outside the measured tokens and features (there the cube sweep speaks)."""
        rows = [(t, f, r) for lay, t, f, r in self.matmul_shapes if lay == layout]
        if not rows:
            return None
        ts, fs = sorted({t for t, _, _ in rows}), sorted({f for _, f, _ in rows})
        if not (ts[0] <= tokens <= ts[-1] and fs[0] <= features <= fs[-1]):
            return None
        return grid_interpolated(rows, tokens, features)


def log_interpolated(sweep, size: float) -> float:
    """A sweep's ((size, rate), ...) rate at ``size``: a straight line in log size and log rate
    between the two swept sizes around it (the time, size / rate, a power of the size between
    them), each end's rate beyond it. The rate of the swept size below made an op one byte past a
    swept size jump to its higher rate, and a rate linear in log size made a bigger op take less
    time wherever the rate climbs steeply: 3.5x higher at 4x the size read as 1.63x at 1.41x the
    size, a time 0.87x the smaller op's (log-log: 1.37x, a time 1.03x). Read this way an op's time
    never falls as it grows between two sizes whose swept times do not."""
    (s0, r0), *rest = sweep
    if size <= s0:
        return r0
    for s1, r1 in rest:
        if size <= s1:
            return r0 * (r1 / r0) ** (math.log(size / s0) / math.log(s1 / s0))
        s0, r0 = s1, r1
    return r0


def grid_interpolated(rows, x: float, y: float) -> float:
    """A rate measured on a grid ((x, y, rate), ...) at (x, y): read along x in log-log at each swept
    y (`log_interpolated`), then along y between those: bilinear in log x, log y and log rate."""
    by_y: dict = {}
    for gx, gy, rate in rows:
        by_y.setdefault(gy, []).append((gx, rate))
    return log_interpolated(sorted((gy, log_interpolated(sorted(line), x)) for gy, line in by_y.items()), y)


# elementwise ops whose transcendentals (tanh, erf, exp) a CPU computes slower than it streams bytes
TRANSCENDENTAL = {"gelu", "gelu_backward", "tanh", "tanh_backward", "exp", "erf", "silu", "silu_backward",
                  "sigmoid", "sigmoid_backward", "_softmax", "_softmax_backward_data", "_log_softmax",
                  "_log_softmax_backward_data"}

# the random fill of CPU's dropout (F.dropout: bernoulli_ on a noise tensor of the input's shape and
# dtype, then div_ and mul): a random number per element, compute-bound on a CPU (measure.rng)
RNG = {"bernoulli_", "bernoulli"}

# aten ops one optimizer update runs per parameter tensor (torch's single-tensor AdamW: mul, lerp,
# addcmul, sqrt, div, add, addcdiv, ... ; SGD with momentum: mul, add, add) and how many tensors a
# foreach/fused CUDA launch takes (MultiTensorApply.cuh, depth 4: 36 tensors)
OPTIMIZER_OPS = {"adamw": 12, "adamw_fused": 1, "sgd": 3, "sgd_nomomentum": 1,
                 # torch's single-tensor Adafactor on a matrix: add_ (step), norm (alpha), two row/column
                 # norm + square_ + div_ + lerp_, mm, mean, clamp_, div_, clamp_, rsqrt_, mul_, norm, add_
                 "adafactor": 20}
FOREACH_TENSORS = 36


def gpu_figures(name: str, dtype: str, peak: float | None, bandwidth_tbs: float | None, compiled: bool) -> Figures:
    """A GPU row's figures for ``dtype`` (fp32 matmuls run on the CUDA cores at the peak's share); its
    matmuls at transformer training shapes where the row has that figure (`gemm`), else at its MAMF.
    A row without a measured MAMF or bandwidth share of its own takes the one of the card it
    `borrows` from (the same chip and kind of memory), as a share, put to its own peak and
    bandwidth (a note of kind expected.borrowed says which figure, from which card)."""
    row = specs.gpu(name)
    mamf, src = (row.mamf[dtype].value, row.mamf[dtype].source) if dtype in row.mamf else (
        None, f"no MAMF figure for {name} {dtype}")
    share = row.bandwidth_share
    frac, bsrc = (share.value, share.source) if share else (None, f"no measured bandwidth fraction for {name}")
    lender = specs.gpu(row.borrows.value) if row.borrows else None
    borrowed = []
    their_peak = lender.tflops.get(dtype) if lender else None
    if mamf is None and lender and dtype in lender.mamf and peak and their_peak:
        theirs, lsrc = lender.mamf[dtype].value, lender.mamf[dtype].source
        mamf = peak * theirs / their_peak
        src = f"{lender.name}'s MAMF share, {theirs:g} of {their_peak:g} TFLOPS ({lsrc})"
        borrowed.append(f"its MAMF from the {lender.name} ({theirs:g} of {their_peak:g} TFLOPS {dtype}: {mamf:.1f} "
                        f"of its {peak:g})")
    if frac is None and lender and lender.bandwidth_share and bandwidth_tbs:
        frac, lsrc = lender.bandwidth_share.value, lender.bandwidth_share.source
        bsrc = f"{lender.name}'s share, {frac:.1%} ({lsrc})"
        borrowed.append(f"its streaming bandwidth from the {lender.name} ({frac:.1%} of the data sheet's: "
                        f"{bandwidth_tbs * frac:.2f} of its {bandwidth_tbs:g} TB/s)")
    launch, lsrc = LAUNCH_S["compiled" if compiled else "eager"]
    att = {kernel: (fig.value, fig.source) for kernel, fig in row.attention.items()}
    gemm = row.gemm.get(dtype)
    return Figures(name=name, peak_tflops=peak, mamf_tflops=mamf, mamf_source=src,
                   gemm_tflops=gemm.value if gemm else None, gemm_source=gemm.source if gemm else "",
                   bandwidth_tbs=bandwidth_tbs * frac if (frac and bandwidth_tbs) else None,
                   bandwidth_source=bsrc, launch_s=launch, launch_source=lsrc, host_bound=False,
                   sms=row.sms.value if row.sms else None, attention=att,
                   borrowed=(f"{'; '.join(borrowed)}: {row.borrows.source}",) if borrowed else ())


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
