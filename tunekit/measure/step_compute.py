"""This CPU's compute figures as a training step runs them: its matmuls by size (64-1024 cubes, over
a step's three layouts), a small model's causal SDPA forward and backward, and GELU: their trials
(`compute_trials`) and the figures from each trial's fastest time (`compute_figures`), for the
stream record (measure.stream). Measurement layer.

Not yet repeatable by construction (issue 39): the small matmuls on 2 threads follow libgomp's idle
wait, a state of the process. On the 2-vCPU VM (2026-12-06) 64-cube fp32 matmuls ran at
0.031-0.036 or 0.065-0.074 TFLOPS, for seconds at a time, flipping within one process;
GOMP_SPINCOUNT=1000 gave 0.069-0.076 in every try and 300000 0.033-0.041 (libgomp reads it as
torch loads, so a running process cannot pin it). The calibration that caught the fast state had
its one-thread host figures (op_s, view_s) 1.6x slower and a 256 KiB multiply 3x slower.
"""
from __future__ import annotations

from tunekit.measure.trials import timed

MATMUL_SIZES = (64, 128, 256, 512, 1024)   # a small model's matmuls, up to where compute dominates
COPIES_CAP = 16   # a matmul figure's operand copies at most (`_matmul_trials`)


def _matmul_trials(n: int, dtype) -> list:
    """An n-cube matmul as a training step runs it: over the three layouts (forward A @ W.T,
    backward G @ W and G.T @ A), operands rotated over copies that together exceed a core's L2
    (8 MiB, at most COPIES_CAP copies), each output written to memory of its own until the round
    ends, as autograd keeps a step's. One trial per layout (each returns its seconds per matmul), its
    operands made here and kept while they live. Repeating one matmul on the same operands instead
    reads them from cache and reuses its output's memory: 13.1 ms against 15.9 ms for the Lab GPT's
    matmuls, which took 16.1 ms inside its step (2026-11-27).

    The outputs are `_out_buffers`, made and touched once here, not new tensors per trial: a new
    tensor's pages are faulted in or not as glibc's malloc state has it (its mmap threshold moves
    with what the process freed before, and it trims its heap), so one calibration's 256-cube trials
    took ~416 page faults each and another's none, in one process: 0.137-0.143 against 0.180-0.183
    TFLOPS (fp32, 2026-12-06, issue 39). Written here, each matmul's output still goes to memory
    the others do not touch, and no trial's time depends on the allocator's history."""
    import torch

    copies = max(2, min(COPIES_CAP, -(-2**23 // (2 * n * n * 4))))
    ops = [(torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)) for _ in range(copies)]
    rounds = max(1, 2**24 // (n**3 * copies))
    outs = _out_buffers(rounds * copies, n, dtype)
    trials = []
    for layout in ((lambda a, b: (a, b.t())), (lambda a, b: (a, b)), (lambda a, b: (a.t(), b))):
        pairs = [layout(a, b) for a, b in ops] * rounds

        def run(pairs=pairs):
            for (x, y), out in zip(pairs, outs):
                torch.mm(x, y, out=out)

        trials.append(timed(run, rounds * copies))
    return trials


def _out_buffers(count: int, n: int, dtype) -> list:
    """``count`` n x n tensors of ``dtype``, every page written once (faulted in now, not in a trial)."""
    import torch

    return [torch.zeros(n, n, dtype=dtype) for _ in range(count)]


def compute_trials(kinds) -> dict:
    """The trials of a record's compute figures, for ``kinds`` ((name, torch dtype), ...), by name:
    every matmul size and layout (("mm", dtype, n, layout)), SDPA (("attention", dtype)) and GELU
    (("gelu", dtype)), in the order `rounds` takes them."""
    trials = {}
    for d, dt in kinds:
        for n in MATMUL_SIZES:
            trials.update({("mm", d, n, i): t for i, t in enumerate(_matmul_trials(n, dt))})
        trials["attention", d] = timed(_attention_run(dt))
        trials["gelu", d] = timed(_gelu_run(dt))
    return trials


def compute_figures(best: dict, kinds) -> tuple:
    """(matmuls, attention, gelu) of a record from each compute trial's fastest seconds (``best``, by
    `compute_trials`' names), taken in warm rounds in turn (`trials.rounds`), so each figure is
    the fastest over the whole span, not over one burst (issue 39: these figures moved a quiet
    calibration's expected step most, by bench_calibration.py --spread)."""
    matmuls = {d: [(n, 2 * n**3 * 3 / sum(best["mm", d, n, i] for i in range(3)) / 1e12) for n in MATMUL_SIZES]
               for d, _ in kinds}
    attention = {d: ATTENTION_FLOPS / best["attention", d] / 1e12 for d, _ in kinds}
    gelu = {d: 2 * GELU_N / best["gelu", d] for d, _ in kinds}
    return matmuls, attention, gelu


ATTN_SHAPE = (8, 4, 128, 32)   # b, h, s, d: a small model's attention
ATTENTION_FLOPS = 7 * ATTN_SHAPE[0] * ATTN_SHAPE[1] * ATTN_SHAPE[2]**2 * ATTN_SHAPE[3]   # forward 4 b h s^2 d,
# backward 10, causal halved: tunekit's count of its FLOPs
GELU_N = 2**20


def _attention_run(dtype):
    """Causal SDPA forward and backward at a small model's shape (ATTN_SHAPE), as one callable."""
    import torch
    import torch.nn.functional as F

    q, k, v = (torch.randn(*ATTN_SHAPE, dtype=dtype, requires_grad=True) for _ in range(3))

    def run():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

    return run


def _gelu_run(dtype):
    """One GELU (tanh) forward and backward of GELU_N elements, as one callable: transcendental, so
    compute-bound on a CPU where a copy's bandwidth would call it free."""
    import torch
    import torch.nn.functional as F

    x = torch.randn(GELU_N, dtype=dtype, requires_grad=True)

    def run():
        F.gelu(x, approximate="tanh").sum().backward()

    return run
