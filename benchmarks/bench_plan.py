"""tunekit.plan: how long a plan takes, how much real memory it uses, and its bounds beside
published measurements (issue 23).

0. The two waits a newcomer meets (issue 39), side by side, each with the machine's conditions
   over it (tunekit.measure.watch_conditions: a busy verdict means the time is not the plan's own):
   GPT-2 124M on a T4 (target: at most 3 s on a quiet 2-core machine), its first plan in the
   process (torch's lazy imports included) and a second one; the 8B below with fp32 weights and
   checkpointing, which does not fit an H100 and so searches its advice (target: at most 30 s).
   ``--targets`` runs only these. Beside each wall time, the CPU time the process took (all its
   threads): on a busy machine the wall time is mostly waiting, and the CPU time says what the
   plan itself cost (a plan is mostly one thread of Python; the verdict is the wall time's).

1. An 8B Llama-3-shaped config (vocab 128,256, hidden 4,096, 32 layers, 32 heads, 8 KV heads,
   d_ff 14,336) planned for one H100 SXM, bf16 weights + AdamW, micro-batch 1 x 8192, with full
   checkpointing: wall time and the process's peak RSS (target: under a minute, little memory).
2. The largest micro-batch that fits, found over fake steps (target: under 3 minutes); and the
   same 8B with fp32 weights and no checkpointing (does not fit): the combinations of changes
   searched and ranked (target: under 60 s).
3. The plan's speed-of-light bound and memory beside published measurements, each row with
   measured/bound: a measurement above its bound would be a modelling error. MFU figures are put
   in one convention first (tunekit's: 6 x matmul weights + attention with its causal half
   removed; the peak the same dense 989 / 312 TFLOPS the publishers used).

Sources (the publishers' own pages):
- torchtitan, benchmarks/llama3_h100_202412_torchtitan.md (Table 1): Llama 3.1 8B, 8 H100s, FSDP,
  local batch 2, selective (op) activation checkpointing, 5,762 tokens/s/GPU (82.4 GiB),
  6,667 with torch.compile (77.0 GiB); "33% to 39% MFU" without Float8, against the SXM peak,
  on H100s with 96 GB HBM2e at 2.4 TB/s and 500 W (slower than an SXM's spec). seq_len 8192:
  its llama3_8b.toml. Its MFU: 6 x params less the embedding + 12*l*h*q*t, "we do not account
  for sparsity in causal attention" (torchtitan utils get_num_flop_per_token).
- llm.c GPT-2 124M "up to ~60%" MFU on an A100; its MFU: 6 x all parameters + 6*L*C*T
  (gpt2_estimate_mfu), against 312 TFLOPS bf16.
- nanochat (dev/LOG.md): d12 ~41%, d18 ~46% MFU on H100s; d20 (561M) 48.65% on 8xH100 against
  989 TFLOPS; its MFU: 6 x non-embedding params + 12*h*q*t per layer, no causal discount
  (nanochat/gpt.py estimate_flops). Their shapes are not read here.
- modded-nanogpt's GPT-2 124M speedrun, 1.765 min on 8xH100: a wall time; its record gives no token
  count for it, so no tokens/s is derived and it is left out.

    .venv/bin/python benchmarks/bench_plan.py [--targets]
"""
import argparse
import os
import resource
import time
import warnings


def parse_args(argv=None) -> argparse.Namespace:
    """The options, read before the heavy imports below: a refused one costs none of them."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", action="store_true", help="only section 0: the two waits of issue 39")
    return ap.parse_args(argv)


if __name__ == "__main__":   # the options first (tests/project/test_bench_args.py)
    ARGS = parse_args()

import torch
from transformers import LlamaConfig

import tunekit
from tunekit.core.formulas import attention_flops_per_token

warnings.filterwarnings("ignore")
GiB = 2**30
LLAMA3_8B = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192)
H100_BF16, A100_BF16 = 989e12, 312e12   # the dense peaks the publishers divided by (H100 SXM, A100)


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def per_token(p) -> float:
    """The plan's model FLOPs per token: tunekit's MFU convention (causal attention halved)."""
    return p.model_flops / p.tokens


def row(what, published, bound, ratio):
    print(f"  {what:<44} {published:>22} {bound:>14} {ratio:>8}")


def timed(what, target_s, fn):
    """``fn()`` timed under the conditions meter: one line, the time against its target."""
    with tunekit.measure.watch_conditions() as w:
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        spent, cpu = time.perf_counter() - t0, time.process_time() - c0
    verdict = "within" if spent <= target_s else "OVER"
    print(f"  {what:<58} {spent:6.1f} s (CPU {cpu:5.1f} s)  target <= {target_s:g} s: {verdict:<6}  "
          f"machine {w.conditions}")
    return out, spent, w.conditions


def targets():
    """Section 0: the 124M plan and the 8B plan with its advice, side by side."""
    print(f"0. the waits of issue 39 (torch {torch.__version__}, {os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.1f} at the start; the targets hold on a quiet machine):")
    gpt2 = tunekit.GPTConfig.preset("gpt2-124m")
    timed("GPT-2 124M on a T4, the process's first plan", 3, lambda: tunekit.plan(gpt2, "T4", verbose=False))
    timed("GPT-2 124M on a T4, again", 3, lambda: tunekit.plan(gpt2, "T4", verbose=False))
    over, _, _ = timed("8B, fp32 weights + bf16 autocast, checkpointing, with advice", 30,
                       lambda: tunekit.plan(LLAMA3_8B, "H100 SXM", precision="bf16", micro_batch=1, seq_len=8192,
                                            checkpointing=True, verbose=False))
    print(f"  the 8B: {over.total_bytes / GiB:.2f} GiB, does not fit; its advice: "
          + "; ".join(f"{a.label} ({a.tokens_per_s:,.0f} tokens/s)" for a in over.advice)
          + f"; peak RSS {rss_mib():,.0f} MiB\n")


def main(args: argparse.Namespace):
    if args.targets:
        targets()
        return
    targets()
    t_all = time.perf_counter()
    t0 = time.perf_counter()
    p = tunekit.plan(LLAMA3_8B, "H100 SXM", precision="bf16", weights="bf16", micro_batch=1, seq_len=8192,
                     checkpointing=True)
    print(f"8B plan on H100 SXM: {time.perf_counter() - t0:.1f} s, peak RSS {rss_mib():,.0f} MiB")
    print(p)
    t0 = time.perf_counter()
    s = tunekit.plan(LLAMA3_8B, "H100 SXM", precision="bf16", weights="bf16", micro_batch=1, seq_len=8192,
                     checkpointing=True, search=True, search_limit=64)
    print(f"largest micro-batch that fits (x 8192 tokens): {s.max_micro_batch}, "
          f"found in {time.perf_counter() - t0:.1f} s, peak RSS {rss_mib():,.0f} MiB")

    # 2b. a step that does not fit: the combinations of changes searched, ranked by expected tokens/s
    t0 = time.perf_counter()
    over = tunekit.plan(LLAMA3_8B, "H100 SXM", precision="bf16", micro_batch=1, seq_len=8192)
    print(f"8B with fp32 weights, no checkpointing: {over.total_bytes / GiB:.2f} GiB, the combination search "
          f"took {time.perf_counter() - t0:.1f} s (target 60 s), peak RSS {rss_mib():,.0f} MiB; its best three:")
    for a in over.advice[:3]:
        print(f"  {a.label}: {a.total_bytes / GiB:.2f} GiB, expected {a.tokens_per_s:,.0f} tokens/s per GPU")

    # 3. published figures beside the plan
    t0 = time.perf_counter()
    # torchtitan's setting: FSDP over 8, local batch 2 x 8192, bf16 compute on fp32 weights. Its
    # selective checkpointing recomputes part of what full checkpointing does: its executed FLOPs
    # lie between no checkpointing's and full's, so only the plan without checkpointing bounds it;
    # its memory lies between the two plans'.
    titan = dict(precision="bf16", micro_batch=2, seq_len=8192, parallel="fsdp", world_size=8)
    none = tunekit.plan(LLAMA3_8B, "H100 SXM", **titan)
    full = tunekit.plan(LLAMA3_8B, "H100 SXM", **titan, checkpointing=True)
    gpt2 = tunekit.GPTConfig.preset("gpt2-124m")
    a100 = {mb: tunekit.plan(gpt2, "A100", precision="bf16", micro_batch=mb, seq_len=1024) for mb in (16, 64)}
    h100 = tunekit.plan(gpt2, "H100 SXM", precision="bf16", micro_batch=16, seq_len=1024)
    planned_s = time.perf_counter() - t0

    # torchtitan counts the masked half of causal attention: its FLOPs per token are tunekit's plus
    # that half (6*L*h*s per token, h = heads x head_dim); the weights' 6N agree (both count the
    # output layer and leave out the embedding; the norms' few weights aside)
    titan_conv = per_token(none) + attention_flops_per_token(32, 4096, 8192, causal=False) / 2
    # llm.c's N is every parameter (position embeddings, biases and norms too); its attention term
    # 6*L*C*T is tunekit's causal half. N here: the plan's fp32 weights / 4 (tunekit's GPT-2 shape)
    llmc_n = a100[16].components["weights"] / 4
    llmc_conv = 6 * llmc_n + attention_flops_per_token(12, 768, 1024, causal=True)
    llmc_to_tunekit = per_token(a100[16]) / llmc_conv

    print(f"\nbound vs published, per GPU ({planned_s:.0f} s for these 5 plans; a bound is an upper bound):")
    row("measurement", "published", "plan's bound", "meas/bnd")
    for label, tps in (("torchtitan 8B, FSDP 8xH100, tokens/s (a)", 5762),
                       ("torchtitan 8B, FSDP + compile, tokens/s (a)", 6667)):
        row(label, f"{tps:,}", f"<= {none.bound_tokens_per_s:,.0f}", f"{tps / none.bound_tokens_per_s:.2f}")
    for label, tps in (("  its MFU, tunekit's convention (b)", 5762), ("  its MFU with compile (b)", 6667)):
        mfu = tps * per_token(none) / H100_BF16
        row(label, f"{mfu:.1%} ({tps * titan_conv / H100_BF16:.1%} theirs)", f"<= {none.bound_mfu:.1%}",
            f"{mfu / none.bound_mfu:.2f}")
    lo, hi = full.peak_bytes / GiB, none.peak_bytes / GiB
    for label, gib in (("torchtitan 8B, FSDP, memory GiB (c)", 82.4),
                       ("torchtitan 8B, + compile, memory GiB (c)", 77.0)):
        row(label, f"{gib}", f"{lo:.1f} .. {hi:.1f}", f"{gib / hi:.2f}")
    mfu = 0.60 * llmc_to_tunekit
    low = min(pl.bound_mfu for pl in a100.values())
    row("llm.c GPT-2 124M, A100, MFU (d)", f"~{mfu:.1%} (~60% theirs)", f"<= {low:.1%}", f"{mfu / low:.2f}")
    for label, mfu in (("nanochat d12, H100s, MFU (e)", 0.41), ("nanochat d18, H100s, MFU (e)", 0.46),
                       ("nanochat d20 561M, 8xH100, MFU (e)", 0.4865)):
        row(label, f"{mfu:.2%} (theirs)", f"<= {h100.bound_mfu:.1%}", f"{mfu / h100.bound_mfu:.2f}")
    print(f"""  (a) bound: the plan without checkpointing, FSDP over 8, 2 x 8192 per rank, bf16 on fp32 weights,
      H100 SXM figures (989 TFLOPS, 3.35 TB/s; their H100s are slower). Their selective checkpointing recomputes
      part of what full checkpointing does, so only the plan without it bounds their run
      (with full checkpointing: <= {full.bound_tokens_per_s:,.0f}).
      Collectives {none.comm_s * 1e3:.0f} ms against {none.compute_bound_s * 1e3:.0f} ms of compute a step.
  (b) MFU from their tokens/s x the plan's model FLOPs per token / 989 TFLOPS; "theirs" counts the masked half of
      causal attention as torchtitan does ({titan_conv / per_token(none):.4f}x tunekit's FLOPs per token) and
      gives back their reported 33-39%.
  (c) their memory against the plan's peak per rank with full checkpointing .. without (selective lies between:
      {'yes' if lo <= 82.4 <= hi and lo <= 77.0 <= hi else 'NO, check the model'}); meas/bnd against the peak without.
  (d) llm.c counts every parameter in 6N ({1 / llmc_to_tunekit:.4f}x tunekit's FLOPs per token for GPT-2 124M);
      its attention term is tunekit's. Bound: the lower of GPT-2 124M at 16 x 1024 ({a100[16].bound_mfu:.1%}) and
      64 x 1024 ({a100[64].bound_mfu:.1%}) on an A100 (312 TFLOPS bf16).
  (e) nanochat's shapes are not read here: the bound is GPT-2 124M's (12 x 768, 16 x 1024) on an H100 SXM; the
      8B's is {none.bound_mfu:.1%}: a larger model's bound is higher (its elementwise traffic weighs less against
      its matmuls), and their d18/d20 are larger than GPT-2 124M. Their MFU counts the masked causal half (more
      FLOPs than tunekit's convention). Both make their figures against this bound err high, never low.
  modded-nanogpt's GPT-2 124M speedrun is left out: 1.765 min on 8xH100 is a wall time, and its record gives
  no token count to turn it into tokens/s.""")
    print(f"\ntotal {time.perf_counter() - t_all:.0f} s, peak RSS {rss_mib():,.0f} MiB")


if __name__ == "__main__":
    main(ARGS)
