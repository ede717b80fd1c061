"""What a well-written kernel reaches on a device, with the source of each figure: the figures
`core.expected` turns a fake step's ops into an expected step time with. Pure data, no torch.

Nothing here is fitted to the training runs a prediction is judged against (benchmarks/
bench_expected.py): each figure is a microbenchmark or a kernel paper's, named beside it.
A device without a figure gets no expectation for what needs it, and a note naming the figure.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from tunekit.core.specs import SPECS

_MAMF = ("stas00/ml-engineering compute/accelerator/README.md, Maximum Achievable Matmul FLOPS comparison table "
         "(swept bf16/fp8 matmuls through torch)")

# Maximum achievable matmul TFLOPS (MAMF), dense, by device and dtype: the best a swept matmul
# reached through torch. H200 shares H100's compute (its bf16 is given as the same figure).
MAMF = {
    ("H100 SXM", "bf16"): (794.5, _MAMF), ("H100 SXM", "fp16"): (794.5, _MAMF + ", bf16's figure"),
    ("H100 SXM", "fp8"): (1402.6, _MAMF),
    # torchtitan's 500 W, 96 GB HBM2e H100: no published MAMF; the 700 W SXM's, an upper bound
    ("H100 SXM 96GB", "bf16"): (794.5, _MAMF + " (the 700 W SXM's: an upper bound for this 500 W card)"),
    ("H100 SXM 96GB", "fp16"): (794.5, _MAMF + " (the 700 W SXM's bf16: an upper bound)"),
    ("H200 SXM", "bf16"): (794.5, _MAMF + " (H200: the H100's)"), ("H200 SXM", "fp16"): (794.5, _MAMF + ", bf16's"),
    ("H200 SXM", "fp8"): (1453.4, _MAMF),
    ("A100 80GB", "bf16"): (271.2, _MAMF), ("A100 80GB", "fp16"): (271.2, _MAMF + ", bf16's figure"),
    ("B200", "bf16"): (1745.0, _MAMF), ("B200", "fp16"): (1745.0, _MAMF + ", bf16's figure"),
    ("MI300X", "bf16"): (668.4, _MAMF), ("MI300X", "fp16"): (668.4, _MAMF + ", bf16's figure"),
}

# The share of the memory bandwidth a streaming kernel reaches (bytes read + written over time).
# The H100's and H200's: the project's own measurements (benchmarks/RESULTS.md, with card, date, torch)
_COPIES = ("measured 2026-11 on an {card}, torch 2.11.0+cu130 (driver CUDA 13): device-to-device copies ~{tbs} TB/s "
           "counting bytes read and written (benchmarks/RESULTS.md)")
_H100_COPIES = _COPIES.format(card="H100 80GB HBM3 (SXM)", tbs="3.0")
BANDWIDTH_FRACTION = {
    "H100 SXM": (3.0 / 3.35, _H100_COPIES),
    "H100 SXM 96GB": (3.0 / 3.35, f"the HBM3 H100 SXM's share ({_H100_COPIES}) of its 2.4 TB/s HBM2e"),
    "H200 SXM": (4.3 / 4.8, _COPIES.format(card="H200 141GB", tbs="4.3")),
    "A100 80GB": (1.80 / 2.04, "read kernel at 1.80 of 2.04 TB/s on an A100 80GB, NCU agreeing "
                          "(forums.developer.nvidia.com/t/trouble-to-reach-peak-bandwidth-of-a100/339083)"),
}

# A card without a measured figure of its own borrows the nearest measured card's, of the same chip
# and kind of memory, as a share: the MAMF's share of the dense peak and the bandwidth fraction, put
# to its own peak and bandwidth (a note of kind expected.borrowed says which figure, from which card).
# No GDDR card (L4, L40S, A10G, T4, RTX 4090/3090) nor a V100 has a measured card of its kind here.
BORROWED = {"A100 40GB": ("A100 80GB", "the same GA100 chip and clocks (NVIDIA A100 data sheet), HBM2 against "
                                       "the 80 GB card's HBM2e")}

# Streaming multiprocessors (the waves a tiled matmul fills): vendor data sheets
SMS = {"H100 SXM": 132, "H100 SXM 96GB": 132, "H200 SXM": 132, "H100 PCIe": 114, "H100 NVL": 132, "A100 80GB": 108,
       "A100 40GB": 108, "B200": 148}
TILE = (128, 128)   # a CUTLASS/cuBLAS threadblock tile of a large half-precision GEMM
WAVE_SOURCE = ("wave quantization over 128 x 128 tiles (NVIDIA Deep Learning Performance Guide, Matrix "
               "Multiplication Background)")

# A matmul dimension that is not a multiple of 8 halves leaves tensor-core-friendly kernels: the
# SwiGLU sweep of stas00/ml-engineering on an H100 at h=4096 ran d_ff=10922 at 272.7 TFLOPS and 10944 at 398.4
MISALIGNED = (272.7 / 398.4, "SwiGLU d_ff sweep on an H100, h=4096 (10922: 272.7, 10944: 398.4 TFLOPS; "
                             "stas00/ml-engineering training/performance/README.md, SwiGLU-based MLP)")
ALIGN = 8

# Fused attention, forward + backward, as a share of the dense peak, by backend, device, head dim
# and sequence length. FLOPs as the kernels' benchmarks count them (and tunekit's counter): forward
# 4*b*h*s^2*d, halved when causal, backward 2.5x the forward (it rebuilds QK^T). Each table holds
# ((head_dim or None: any, seq, share), ...): the rows of the nearest head dim, interpolated in
# log(seq) and held flat outside (`attention_share`). Backends: "flash" = FlashAttention-2 (torch's
# SDPA flash kernel is FA2), "fa3" = FlashAttention-3 (Hopper), "triton" = the FlashAttention-1-era
# Triton kernel (HazyResearch flash_attn_triton.py on triton 2.0.0.dev20221202, which llm-foundry's
# attn_impl="triton" copied, its default until 2024).
#
# A100: the FlashAttention-2 paper (arXiv 2307.08691, abstract and section 4.1) gives ranges over its
# sweep (sequence 512 to 16k, head dim 64 and 128, causal or not): FlashAttention-2 "50-73% of the
# theoretical maximum FLOPs/s on A100", FlashAttention(-1) "25-40%". Its figures rise with the sequence
# (more blocks per SM, fewer partial tiles), so each range's low end is placed at 512 and its high end
# at 16k. The Triton kernel's own docstring: "Overall Triton forward + backward is slightly slower than
# CUDA forward + backward" (the CUDA one being FlashAttention-1): the FA1 range, an upper bound.
# Hopper (sm90): flash-attention PR #1791 (benchmark_attn.py, Hopper, head dim 128, seq 8192, causal):
# FA2 forward 1.935 ms at 284.1 TFLOPS, backward 4.788 ms at 287.1 -> 3.5 x 284.1 x 1.935 / 6.723 ms =
# 286.2 TFLOPS (28.9% of 989); FA3 forward 0.873 ms at 630.0, backward 2.585 ms at 531.6 -> 3.5 x 630.0
# x 0.873 / 3.458 ms = 556.7 TFLOPS (56.3%). (FA3's "740 TFLOPS, 75%" is its best forward alone.)
# The Triton kernel on Hopper: no published figure; it and FA2 both issue Ampere mma instructions there
# (no wgmma), so FA2's Hopper figure is scaled by the two kernels' ratio on the A100 at the same
# sequence (e.g. 2048: 31.0% / 59.2%).
_FA2_A100 = "FlashAttention-2 paper (arXiv 2307.08691): FA2 50-73% of an A100 over seq 512-16k"
_FA1_A100 = ("FlashAttention-2 paper: FlashAttention 25-40% of an A100 over seq 512-16k; the Triton kernel "
             "'slightly slower than CUDA' (flash_attn_triton.py)")
_HOPPER = "flash-attention PR #1791 benchmark_attn.py on Hopper (hdim 128, seq 8192, causal): "
_FA2_H100 = _HOPPER + "FA2 286.2 TFLOPS fwd+bwd (28.9%)"
_FA3_H100 = _HOPPER + "FA3 556.7 TFLOPS fwd+bwd (56.3%)"
_SWEEP = (512, 16384)
_FA2_A100_ROWS = ((None, _SWEEP[0], 0.50), (None, _SWEEP[1], 0.73))
_FA1_A100_ROWS = ((None, _SWEEP[0], 0.25), (None, _SWEEP[1], 0.40))
_FA2_H100_ROWS = ((128, 8192, 3.5 * 284.1 * 1.935 / (1.935 + 4.788) / 989),)
_FA3_H100_ROWS = ((128, 8192, 3.5 * 630.0 * 0.873 / (0.873 + 2.585) / 989),)
ATTENTION = {
    ("flash", "A100 80GB"): (_FA2_A100_ROWS, _FA2_A100), ("flash", "A100 40GB"): (_FA2_A100_ROWS, _FA2_A100),
    ("triton", "A100 80GB"): (_FA1_A100_ROWS, _FA1_A100), ("triton", "A100 40GB"): (_FA1_A100_ROWS, _FA1_A100),
    ("flash", "H100 SXM"): (_FA2_H100_ROWS, _FA2_H100), ("flash", "H200 SXM"): (_FA2_H100_ROWS, _FA2_H100),
    ("fa3", "H100 SXM"): (_FA3_H100_ROWS, _FA3_H100), ("fa3", "H200 SXM"): (_FA3_H100_ROWS, _FA3_H100),
    # torchtitan's 500 W H100: the 700 W card's figures, upper bounds
    ("flash", "H100 SXM 96GB"): (_FA2_H100_ROWS, _FA2_H100 + " (the 700 W card's: an upper bound)"),
    ("fa3", "H100 SXM 96GB"): (_FA3_H100_ROWS, _FA3_H100 + " (the 700 W card's: an upper bound)"),
}
# the kernels `tunekit.plan(attention_kernel=...)` names (None: "flash", FA2-class, what torch's SDPA runs)
ATTENTION_KERNELS = {"flash": "FlashAttention-2 (torch's SDPA flash kernel)", "fa3": "FlashAttention-3 (Hopper)",
                     "triton": "the FlashAttention-1-era Triton kernel (llm-foundry attn_impl='triton', 2023)"}


def attention_share(rows, head_dim: int | None, seq: int | None) -> float:
    """The share of the peak a fused attention kernel reaches at this head dim and sequence: the
    rows of the nearest head dim given (None rows: any), interpolated in log(seq), flat outside."""
    dims = {d for d, _, _ in rows}
    if head_dim is not None and dims - {None}:
        near = min(dims - {None}, key=lambda d: (abs(d - head_dim), d))
        rows = [r for r in rows if r[0] == near]
    pts = sorted((s, v) for _, s, v in rows)
    if seq is None or seq <= pts[0][0]:
        return pts[0][1]
    if seq >= pts[-1][0]:
        return pts[-1][1]
    for (s0, v0), (s1, v1) in zip(pts, pts[1:]):
        if s0 <= seq <= s1:
            f = math.log(seq / s0) / math.log(s1 / s0)
            return v0 + f * (v1 - v0)
    return pts[-1][1]


def _scaled(rows_to, rows_a100, rows_a100_ref, seqs):
    """``rows_to`` scaled at each sequence by the ratio of two kernels' A100 shares there."""
    return tuple((None, s, attention_share(rows_to, None, s) * attention_share(rows_a100, None, s)
                  / attention_share(rows_a100_ref, None, s)) for s in seqs)


_TRITON_H100_ROWS = _scaled(_FA2_H100_ROWS, _FA1_A100_ROWS, _FA2_A100_ROWS, (512, 1024, 2048, 4096, 8192, 16384))
_TRITON_H100 = ("the FA2 Hopper figure (" + _FA2_H100 + ") times the Triton / FA2 ratio on an A100 at the same "
                "seq (FlashAttention-2 paper's ranges): both kernels issue Ampere mma there")
ATTENTION[("triton", "H100 SXM")] = (_TRITON_H100_ROWS, _TRITON_H100)
ATTENTION[("triton", "H200 SXM")] = (_TRITON_H100_ROWS, _TRITON_H100)

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
    view_s: float | None = None       # host time of an op that makes no kernel (a view); None: not counted
    module_s: float | None = None     # host time of an nn.Module call around its forward
    host_source: str = ""
    checkpoint_s: tuple | None = None  # (per checkpointed segment, per saved tensor): torch's checkpoint's own time
    checkpoint_source: str = ""
    busy: tuple = ()                  # the calibrations these figures come from that were taken on a busy machine
    borrowed: tuple = ()              # words: which figure came from which measured card, and why that one

    def missing(self) -> list:
        out = []
        if not self.mamf_tflops:
            out.append("its maximum achievable matmul TFLOPS (MAMF)")
        if not (self.bandwidth_tbs or self.bandwidth_sweep):
            out.append("the memory bandwidth a streaming kernel reaches")
        return out

    def tbs_at(self, nbytes: float, cold: bool = False) -> float:
        """The bandwidth an op moving ``nbytes`` reaches: a CPU's sweep read between its sizes in
        log-log (`log_interpolated`), else the one figure. ``cold``: an op reading a tensor written
        long before (a backward's, an optimizer's), where such a sweep was measured: never faster
        than the same op with its inputs in cache (a read from memory cannot beat one from cache)."""
        if not self.bandwidth_sweep:
            return self.bandwidth_tbs
        hot = log_interpolated(self.bandwidth_sweep, nbytes)
        return min(hot, log_interpolated(self.cold_sweep, nbytes)) if cold and self.cold_sweep else hot


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
    lender, why = BORROWED.get(name, (None, ""))
    borrowed = []
    their_peak = next((s.tflops.get(dtype) for s in SPECS if s.name == lender), None)
    if mamf is None and (lender, dtype) in MAMF and peak and their_peak:
        theirs, lsrc = MAMF[(lender, dtype)]
        mamf, src = peak * theirs / their_peak, f"{lender}'s MAMF share, {theirs:g} of {their_peak:g} TFLOPS ({lsrc})"
        borrowed.append(f"its MAMF from the {lender} ({theirs:g} of {their_peak:g} TFLOPS {dtype}: {mamf:.1f} of its "
                        f"{peak:g})")
    if frac is None and lender in BANDWIDTH_FRACTION and bandwidth_tbs:
        frac, lsrc = BANDWIDTH_FRACTION[lender]
        bsrc = f"{lender}'s share, {frac:.1%} ({lsrc})"
        borrowed.append(f"its streaming bandwidth from the {lender} ({frac:.1%} of the data sheet's: "
                        f"{bandwidth_tbs * frac:.2f} of its {bandwidth_tbs:g} TB/s)")
    launch, lsrc = LAUNCH_S["compiled" if compiled else "eager"]
    att = {b: v for (b, dev), v in ATTENTION.items() if dev == name}
    return Figures(name=name, peak_tflops=peak, mamf_tflops=mamf, mamf_source=src,
                   bandwidth_tbs=bandwidth_tbs * frac if (frac and bandwidth_tbs) else None,
                   bandwidth_source=bsrc, launch_s=launch, launch_source=lsrc, host_bound=False,
                   sms=SMS.get(name), attention=att,
                   borrowed=(f"{'; '.join(borrowed)}: {why}",) if borrowed else ())


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
