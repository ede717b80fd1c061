"""FLOP and throughput formulas, one pure function each (no torch, no IPython).

Conventions: 1 MAC = 2 FLOPs; "TFLOPS" is 1e12 FLOP per second; N is the number of parameters
that take part in matmuls (embeddings excluded, the output projection included when it is a
matmul); L layers, h = n_head * head_dim (the model width), s the sequence length.
"""
from __future__ import annotations

import math

from tunekit.core.units import is_missing

# --- counting ------------------------------------------------------------------------------


def macs_to_flops(macs: float) -> float:
    """A multiply-accumulate is a multiply and an add: 2 FLOPs."""
    return 2 * macs


def flops_to_macs(flops: float) -> float:
    """The reverse only holds for fused multiply-adds: 100 FLOPs of MACs are 50 MACs."""
    return flops / 2


def matmul_flops(m: int, k: int, n: int) -> int:
    """(m, k) @ (k, n): m*n dot products of length k, each k MACs -> 2*m*k*n FLOPs."""
    return 2 * m * k * n


def attention_flops_per_token(n_layer: int, d_model: int, seq_len: int, causal: bool = True) -> float:
    """Forward+backward FLOPs per token of the two attention matmuls (QK^T and AV).

    Forward is 2 matmuls of 2*s*h FLOPs per token each (4*L*h*s), backward twice that: 12*L*h*s,
    as in nanoGPT's `estimate_mfu`. A causal mask leaves half of the score matrix useful, and
    kernels that skip masked blocks (FlashAttention) do half the work, so causal halves it.
    """
    full = 12 * n_layer * d_model * seq_len
    return full / 2 if causal else full


def train_flops_per_token(n_params: float, n_layer: int, d_model: int, seq_len: int,
                          causal: bool = True, recompute: bool = False) -> float:
    """Model FLOPs per trained token: 6N for the weights (2N forward, 4N backward) + attention.

    With full activation recomputation the forward runs twice: 8N and 4/3 of the attention
    term (the factor 4 instead of 3 of stas00/ml-engineering training/performance/README.md, TFLOPS
    as a performance metric). Those are hardware FLOPs (HFU); MFU uses
    `recompute=False` whatever the run did.
    """
    weights = (8 if recompute else 6) * n_params
    attn = attention_flops_per_token(n_layer, d_model, seq_len, causal)
    return weights + (attn * 4 / 3 if recompute else attn)


def forward_flops_per_token(n_params: float, n_layer: int, d_model: int, seq_len: int,
                            causal: bool = True) -> float:
    """Model FLOPs per token of a forward pass alone (inference, evaluation): 2N + the forward's
    third of the attention term (4*L*h*s, halved when causal). A third of `train_flops_per_token`."""
    return 2 * n_params + attention_flops_per_token(n_layer, d_model, seq_len, causal) / 3


def inference_flops_per_layer(batch: int, seq_len: int, d_model: int) -> int:
    """Forward FLOPs of one transformer layer: 24*B*s*h^2 + 4*B*s^2*h (4h MLP, no causal discount)."""
    return 24 * batch * seq_len * d_model**2 + 4 * batch * seq_len**2 * d_model


def estimate_tflops(model_size_b: float, seq_len: int, global_batch: int, step_s: float,
                    n_gpus: int = 1, recompute: bool = True) -> float:
    """The per-GPU estimate `model_size_in_B * (4|3) * 2 * seqlen * gbs / (t * gpus * 1e3)`
    (stas00/ml-engineering training/performance/README.md, TFLOPS as a performance metric).

    model_size_b is in billions, so 1e9 / 1e12 leaves the 1e3. Factor 4 with activation
    checkpointing (an extra forward), 3 without. It slightly under-reports: no attention term.
    """
    factor = 4 if recompute else 3
    return model_size_b * factor * 2 * seq_len * global_batch / (step_s * n_gpus * 1e3)


# --- rates and utilization --------------------------------------------------------------------

# The two ways a record's MFU numerator is obtained (its `mfu_convention`).
MFU_ANALYTIC = "analytic: 6 x matmul weights x tokens + causal attention at half, no recompute"
# Counted model FLOPs are the analytic convention's where the count finds causal attention: SDPA's
# is_causal, an eager (math) attention's causal mask, an SDPA given one (measure.causal_mask).
MFU_COUNTED = ("counted: executed FLOPs minus checkpoint and attention-score recompute and the masked "
               "half of causal attention")


def tflops(flops: float, seconds: float) -> float:
    """Achieved TFLOPS; NaN when either input is missing or the time is not positive."""
    if is_missing(flops) or is_missing(seconds) or not seconds > 0:
        return math.nan
    return flops / seconds / 1e12


def utilization(flops: float, seconds: float, peak_tflops: float | None) -> float:
    """flops / seconds / peak: MFU with model FLOPs, HFU with executed FLOPs. NaN if unknown."""
    if is_missing(peak_tflops) or not peak_tflops > 0:
        return math.nan
    return tflops(flops, seconds) / peak_tflops


# --- batch arithmetic ------------------------------------------------------------------------


def data_parallel_size(n_gpus: int, tp: int = 1, pp: int = 1) -> int:
    """DP = N / (TP * PP); the GPUs must split evenly."""
    if n_gpus % (tp * pp):
        raise ValueError(f"{n_gpus} GPUs do not split into TP={tp} x PP={pp} groups")
    return n_gpus // (tp * pp)


def global_batch_size(micro_batch: int, dp: int = 1, grad_accum: int = 1) -> int:
    """GBS = MBS * DP * GAS (samples per optimizer step)."""
    return micro_batch * dp * grad_accum


# --- all-reduce bandwidth (nccl-tests convention) ---------------------------------------------


def algbw(size_bytes: float, time_s: float) -> float:
    """Algorithm bandwidth: bytes of the buffer / time (bytes per second)."""
    return size_bytes / time_s if time_s > 0 else float("nan")


def allreduce_busbw(algbw_bytes_per_s: float, n_ranks: int) -> float:
    """Bus bandwidth of an all-reduce: algbw * 2(n-1)/n, the per-link traffic of a ring, so it
    is comparable across rank counts (nccl-tests PERFORMANCE.md). 1 rank moves nothing: 0."""
    return algbw_bytes_per_s * 2 * (n_ranks - 1) / n_ranks
