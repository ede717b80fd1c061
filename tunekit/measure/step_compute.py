"""This CPU's compute figures as a training step runs them: its matmuls by size (64-1024 cubes, over
a step's three layouts), its linear layers' tall-skinny matmuls by their shape class (`SHAPE_LONG`
tokens by `SHAPE_WIDE` features, in each of the three layouts), a small model's causal SDPA forward
and backward, and GELU: their trials (`compute_trials`) and the figures from each trial's fastest
time (`compute_figures`), for the stream record (measure.stream). Measurement layer.

Why the shapes (issue 42): a linear layer's matmuls are [tokens x hidden] @ [hidden x out] and its
backward's transposes, and the cube sweep read at the cube root of m k n says a doubled token count
grows them 1.94x, where they grew 2.07-2.32x inside a step: a cube's rate climbs with every
dimension, a tall-skinny matmul's stays flat as only its token dimension grows.

Not repeatable by construction (issue 39): the small matmuls on 2 threads follow libgomp's idle
wait, a state of the process. On the 2-vCPU VM (2026-12-06) 64-cube fp32 matmuls ran at
0.031-0.036 or 0.065-0.074 TFLOPS, for seconds at a time, flipping within one process. Setting a
wait policy before torch loads pins that one figure (GOMP_SPINCOUNT=1000: 0.069-0.076 in every
try; 300000: 0.033-0.041) but did not steady what the figures are for: under GOMP_SPINCOUNT=1000
the quick ladder's base step measured again was +27% and +39% off, and ``OMP_WAIT_POLICY=PASSIVE``
left fresh calibrations as far apart and the steps 1.13x slower (benchmarks/RESULTS.md). So
tunekit sets no wait policy; the stream record holds the one its trials ran under and its cache
is keyed by it (measure.conditions_gomp). The calibration that caught the fast state had its
one-thread host figures (op_s, view_s) 1.6x slower and a 256 KiB multiply 3x slower.
Interleaving every figure's trials over the calibration (`trials.interleaved`) does not reach it: the
state holds for a whole process (one calibration's 64-cube trials were 0.071 TFLOPS at their fastest
and within 1.5x of it in all 8 rounds over ~30 s; others' 0.031-0.033 throughout), and short processes
took 0.028-0.033 under the default and 0.051-0.071 under GOMP_SPINCOUNT=1000 (2026-12-06, load ~5).
The lever is torch's thread count (`or_one_thread`): the 64-cube's figure is now the faster of its
trials on torch's threads and on one, the same in every process (2026-12-07).
"""
from __future__ import annotations

from tunekit.core.registry import BF16, FP32
from tunekit.measure.trials import built, timed

MATMUL_SIZES = (64, 128, 256, 512, 1024)   # a small model's matmuls, up to where compute dominates
ONE_THREAD_SIZES = (64,)   # cubes also timed on one thread, the faster kept (`or_one_thread`)
COPIES_CAP = 16   # a matmul figure's operand copies at most (`_matmul_trials`)
# the tall-skinny shape classes (`_shape_trials`): tokens (the long dimension) by features (both
# others), the Lab GPT's micro-batch 2 to 16 at 128 tokens, a tiny model's width to a small one's;
# in both dtypes a CPU step runs (18 trials each, the largest one 1 GFLOP matmul). bf16 was read from
# the cube sweep, whose small cubes pay bf16's per-call cost per matrix: the small Llama's bf16 linear
# layers were priced at 0.56-0.94x fp32's time where they ran at 0.62-1.13x, its bf16 step expected
# ~12% fast (benchmarks/RESULTS.md, the afternoon session of 2026-12-07)
SHAPE_LONG = (256, 512, 2048)
SHAPE_WIDE = (128, 512)
SHAPE_LAYOUTS = ("forward", "input", "weight")   # A @ W.T -> (L, W); G @ W -> (L, W); G.T @ A -> (W, W)
SHAPE_KINDS = (FP32, BF16)
SHAPE_WORK = 2**23   # m k n of one trial at least: ~17 MFLOP, under a ms at this CPU's rate


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

        trial = timed(run, rounds * copies)
        trials.append(or_one_thread(trial) if n in ONE_THREAD_SIZES else trial)
    return trials


def or_one_thread(trial):
    """``trial`` (returning its seconds) timed as it is and again on one intra-op thread, the faster
    kept; torch's thread count put back after, also on an exception.

    Why (issue 39): on the 2-vCPU VM a process's 64-cube fp32 matmuls on torch's 2 threads run in one of
    two states for its whole life, 0.031-0.034 or 0.066-0.074 TFLOPS, while on one thread they run at
    0.073-0.075 in every process. Within one process ``torch.set_num_threads`` moves it: a slow process
    measured 0.033 on 2 threads and 0.074 on 1, three times in turn, and went back to 0.033 each time;
    a fast one read 0.066-0.074 on both (2026-12-07, benchmarks/bench_calibration.py --states). The
    operands' page offsets (all at offset 0, or 31 offsets in one process), flushing denormals, MKL's
    memory manager (``MKL_DISABLE_FAST_MM``) and the Python hash seed left processes in either state.
    So the figure of these sizes is the faster of the two thread counts: the same in every process.
    A step in a process of the slow state runs its smallest matmuls slower than the figure says. Not
    covered: the larger cubes, which torch's threads run faster than one, also lose in that state (a
    slow-state calibration's 128-cube 0.105 TFLOPS against 0.138-0.153 in three others, 2026-12-07)."""
    import torch

    def faster():
        many, threads = trial(), torch.get_num_threads()
        if threads == 1:
            return many
        torch.set_num_threads(1)
        try:
            return min(many, trial())
        finally:
            torch.set_num_threads(threads)

    return faster


def _out_buffers(count: int, n: int, dtype) -> list:
    """``count`` n x n tensors of ``dtype``, every page written once (faulted in now, not in a trial)."""
    import torch

    return [torch.zeros(n, n, dtype=dtype) for _ in range(count)]


def _shape_trials(long: int, wide: int, dtype) -> dict:
    """A linear layer's three matmuls at ``long`` tokens by ``wide`` features, as a step runs them, by
    layout (`SHAPE_LAYOUTS`): the forward A @ W.T and the input gradient G @ W, both (long x wide) @
    (wide x wide) into a tall output, and the weight gradient G.T @ A, reducing over the tokens into
    a (wide x wide) one. Activations rotated over copies that together exceed the two cores' L2s (4 MiB,
    at most COPIES_CAP), the weight shared (as a layer's is), outputs into buffers faulted in before
    the trials (`_out_buffers`, as `_matmul_trials`). Each trial returns its seconds per matmul."""
    import torch

    # activations over 4 MiB in all, twice the two cores' L2s (one copy from 512 x 512 up: the largest
    # shape's trial is one matmul of 2^29 m k n), so the trials cost ~2^30 m k n a layout
    copies = max(1, min(COPIES_CAP, -(-2**22 // (2 * long * wide * 4))))
    acts = [(torch.randn(long, wide).to(dtype), torch.randn(long, wide).to(dtype)) for _ in range(copies)]
    w = torch.randn(wide, wide).to(dtype)
    reps = max(1, SHAPE_WORK // (long * wide * wide * copies))
    trials = {}
    for layout, pick, rows in (("forward", lambda a, g: (a, w.t()), long), ("input", lambda a, g: (g, w), long),
                               ("weight", lambda a, g: (g.t(), a), wide)):
        pairs = [pick(a, g) for a, g in acts] * reps
        outs = [torch.zeros(rows, wide, dtype=dtype) for _ in pairs]

        def run(pairs=pairs, outs=outs):
            for (x, y), out in zip(pairs, outs):
                torch.mm(x, y, out=out)

        trials[layout] = timed(run, len(pairs))
    return trials


def compute_trials(kinds) -> dict:
    """The trials of a record's compute figures, for ``kinds`` ((name, torch dtype), ...), by name:
    every matmul size and layout (("mm", dtype, n, layout)), the tall-skinny shapes of SHAPE_KINDS
    (("shape", dtype, layout, long, wide)), SDPA (("attention", dtype)) and GELU (("gelu", dtype)),
    in the order `trials.interleaved` takes them, each made ahead of the machine's other work (`trials.built`)."""
    trials = {}
    for d, dt in kinds:
        for n in MATMUL_SIZES:
            trials.update({("mm", d, n, i): t for i, t in enumerate(built(_matmul_trials, n, dt))})
        for long in SHAPE_LONG if d in SHAPE_KINDS else ():
            for wide in SHAPE_WIDE:
                trials.update({("shape", d, k, long, wide): t for k, t in built(_shape_trials, long, wide, dt).items()})
        trials["attention", d] = built(lambda dt=dt: timed(_attention_run(dt)))
        trials["gelu", d] = built(lambda dt=dt: timed(_gelu_run(dt)))
    return trials


def shape_figures(best: dict) -> dict:
    """A record's tall-skinny matmuls from the trials' fastest seconds (``best``, by `compute_trials`'
    names): dtype -> [(layout, long, wide, TFLOPS), ...], each 2 x long x wide^2 FLOPs over its time."""
    out: dict = {}
    for key, t in best.items():
        if key[0] == "shape":
            _, d, layout, long, wide = key
            out.setdefault(d, []).append((layout, long, wide, 2 * long * wide * wide / t / 1e12))
    return out


def compute_figures(best: dict, kinds) -> tuple:
    """(matmuls, attention, gelu) of a record from each compute trial's fastest seconds (``best``, by
    `compute_trials`' names), taken round-robin with the host's (`trials.interleaved`), so each figure
    is the fastest over the whole calibration, not over one burst (issue 39: these figures moved a quiet
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
