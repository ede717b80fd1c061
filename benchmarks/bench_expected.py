"""Plan.expected beside published training runs (issue 31, item 2): the expected tokens/s per GPU of
each run's shape and setting, planned over a fake step, against what its publisher measured.

No figure here was fitted to these runs: the expectation's constants are core/efficiency.py's
(MAMF table, streaming bandwidth, FlashAttention papers, launch costs), each with its source.

Runs (tokens/s per GPU as published; the software each ran on):
- MosaicML llm-foundry, scripts/train/benchmarking/README.md, the tables of commit b2a43a1
  (2023-10-19). Its sweep.sh submits image mosaicml/pytorch:2.1.0_cu121 and passes no --attn_impl, so
  submit_benchmarks.py's default ran: attn_impl="triton", llm-foundry's copy of HazyResearch's
  FlashAttention-1-era flash_attn_triton.py (planned with attention_kernel="triton"). FSDP FULL_SHARD
  over 8 GPUs, amp_bf16 on fp32 weights (Composer's DEFAULT mixed precision): MPT models,
  d_model x heads x layers 768x12x12 (125m), 1024x16x24 (350m), 1536x12x24 (760m), 2048x16x24 (1b),
  2560x20x32 (3b), 4096x32x32 (7b), 5120x40x40 (13b); vocab 50368, GELU MLP 4x, learned positions,
  no biases. Each row's micro-batch, sequence and activation checkpointing are the table's.
- torchtitan benchmarks/llama3_h100_202412_torchtitan.md (Dec 2024; torch nightly 2024-12-23):
  Llama 3.1 8B, FSDP over 8 / 128 H100s, local batch 2 x 8192, selective activation checkpointing,
  with and without torch.compile. Their H100s are 96 GB HBM2e at 2.4 TB/s and 500 W: the spec
  table's "H100 SXM 96GB" (that bandwidth; the 700 W card's compute figures, upper bounds: torchtitan
  says its peak is "between SXM and NVL" and unknown).
- llm.c GPT-2 124M on an A100, "up to ~60%" MFU in llm.c's convention (6 x all parameters +
  6*L*C*T per token, 312 TFLOPS; 2024, its own CUDA kernels, fused everything): tokens/s derived
  from that MFU, planned as 64 x 1024 per GPU.

    .venv/bin/python benchmarks/bench_expected.py          # the published runs
    .venv/bin/python benchmarks/bench_expected.py --cpu    # the Lab's GPT on this CPU, expected vs measured
"""
import statistics
import sys
import time
import warnings

from transformers import LlamaConfig

import tunekit

warnings.filterwarnings("ignore")

MPT = {"125m": (768, 12, 12), "350m": (1024, 16, 24), "760m": (1536, 12, 24), "1b": (2048, 16, 24),
       "3b": (2560, 20, 32), "7b": (4096, 32, 32), "13b": (5120, 40, 40)}
# (model, device, seq_len, micro_batch, checkpointing, published tokens/s/GPU): the README's rows on 8 GPUs
MPT_ROWS = [
    ("125m", "A100", 2048, 32, False, 141737), ("350m", "A100", 2048, 32, False, 58782),
    ("760m", "A100", 2048, 24, False, 32434), ("1b", "A100", 2048, 14, False, 20513),
    ("3b", "A100", 2048, 10, False, 10811), ("7b", "A100", 2048, 6, False, 4641),
    ("13b", "A100", 2048, 2, False, 2262), ("350m", "A100", 8192, 8, False, 36569),
    ("1b", "A100", 8192, 3, False, 13814), ("7b", "A100", 8192, 8, True, 3206),
    ("760m", "H100 SXM", 2048, 24, False, 63147), ("1b", "H100 SXM", 2048, 14, False, 45455),
    ("7b", "H100 SXM", 2048, 6, False, 10643), ("13b", "H100 SXM", 2048, 2, False, 4792),
    ("1b", "H100 SXM", 8192, 3, False, 29157), ("3b", "H100 SXM", 8192, 3, False, 16578),
    ("7b", "H100 SXM", 4096, 16, True, 8611),
]
LLAMA3_8B = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192)


def mpt(name, seq):
    d, h, n = MPT[name]
    return tunekit.GPTConfig(vocab_size=50368, n_layer=n, n_head=h, n_embd=d, block_size=seq, pos="learned",
                             mlp="gelu", bias=False)


def runs():
    """(label, era, published tokens/s/GPU, what to plan: a function returning the Plan)."""
    out = []
    for name, dev, seq, mb, ck, tps in MPT_ROWS:
        label = f"MPT-{name} {dev.split()[0]} 8 GPUs {mb}x{seq}" + (" ckpt" if ck else "")
        out.append((label, "llm-foundry 2023", tps,
                    lambda name=name, dev=dev, seq=seq, mb=mb, ck=ck: tunekit.plan(
                        mpt(name, seq), dev, precision="bf16", micro_batch=mb, seq_len=seq, checkpointing=ck,
                        parallel="fsdp", world_size=8, attention_kernel="triton")))
    for gpus, compiled, tps in ((8, False, 5762), (8, True, 6667), (128, False, 5605), (128, True, 6514)):
        setting = tunekit.Setting(precision="bf16", micro_batch=2, seq_len=8192, parallel="fsdp", world_size=gpus,
                                  nodes=gpus // 8, compile=compiled, device="H100 SXM 96GB")
        # selective (op) checkpointing: torchtitan's policy saves every other matmul's output and
        # recomputes the rest of the forward, half its matmuls: the step midway between none and full
        out.append((f"torchtitan Llama3-8B {gpus} H100s 2x8192 SAC" + (" compile" if compiled else ""),
                    "torchtitan 2024-12", tps,
                    lambda s=setting: [tunekit.plan(LLAMA3_8B, setting=s.replace(checkpointing=ck))
                                       for ck in (False, True)]))
    gpt2 = tunekit.GPTConfig.preset("gpt2-124m")
    n = 124_475_904   # every parameter of GPT-2 124M (llm.c's N)
    llmc = 0.60 * 312e12 / (6 * n + 6 * 12 * 768 * 1024)
    # llm.c's kernels are hand-fused: planned as a compiled step (its memory-bound ops fused)
    out.append(("llm.c GPT-2 124M A100 64x1024 fused (~60% MFU)", "llm.c 2024", round(llmc),
                lambda: tunekit.plan(gpt2, setting=tunekit.Setting(precision="bf16", micro_batch=64, seq_len=1024,
                                                                   compile=True, device="A100"))))
    return out


def cpu_labs():
    """The two models item 3 names: the Lab's built-in GPT and a small transformers Llama (random init)."""
    from transformers import LlamaForCausalLM

    yield "Lab GPT", tunekit.Lab()
    cfg = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=344, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    yield "Llama 4x128", tunekit.Lab(LlamaForCausalLM(cfg), seq_len=128, micro_batch=4)


def cpu_rows():
    """Expected against measured on this CPU, with the machine's verdict (quiet throughout or not)."""
    from tunekit.core.expected import agreement
    from tunekit.measure.peaks import calibrate
    from tunekit.measure.stream import measure_stream

    # the sweeps the expectation takes, measured again just before each row's plan and run: this
    # VM's speed drifts by 20% within minutes under a "quiet" verdict (no steal, no load: nothing a
    # verdict reads), so figures taken even minutes apart from a run would judge another machine
    print(f"{'on this CPU':<34}{'expected ms':>12}{'measured ms':>12}{'exp/meas':>9}{'fastest ms':>11}"
          f"{'exp/fast':>9}  verdict")
    for name, lab in cpu_labs():
        for precision in ("fp32", "bf16"):
            for ck in (False, True):
                measure_stream(refresh=True)
                p = tunekit.plan(lab, "cpu", precision=precision, checkpointing=ck)
                r = lab.run(steps=20, precision=precision, checkpointing=ck, verbose=False)
                verdicts = {r.conditions.verdict if r.conditions else "unknown", measure_stream().verdict,
                            calibrate(precision, "cpu").verdict}
                verdict = "busy" if verdicts - {"quiet"} else "quiet"
                word = agreement(p.expected.step_s, r.step_s, verdict)
                label = f"{name} {precision}" + (" + ckpt" if ck else "")
                print(f"{label:<34}{p.expected.step_s * 1e3:>12.2f}{r.step_s * 1e3:>12.2f}"
                      f"{p.expected.step_s / r.step_s:>9.2f}{r.step_s_min * 1e3:>11.2f}"
                      f"{p.expected.step_s / r.step_s_min:>9.2f}  {word} ({verdict}: run "
                      f"{r.conditions.verdict if r.conditions else '?'})", flush=True)


def main():
    t_all = time.perf_counter()
    if "--cpu" in sys.argv:
        cpu_rows()
        return
    print(f"{'run':<52}{'software':<20}{'published':>11}{'expected':>11}{'exp/pub':>9}{'plan s':>8}")
    errors = []
    for label, era, tps, planned in runs():
        t0 = time.perf_counter()
        plans = planned()
        plans = plans if isinstance(plans, list) else [plans]
        took = time.perf_counter() - t0
        if any(p.expected is None for p in plans):
            print(f"{label:<52}{era:<20}{tps:>11,}{'none':>11}{'':>9}{took:>8.1f}")
            continue
        expected = plans[0].tokens / statistics.mean(p.expected.step_s for p in plans)
        ratio = expected / tps
        errors.append((abs(ratio - 1), label))
        print(f"{label:<52}{era:<20}{tps:>11,}{expected:>11,.0f}{ratio:>9.2f}{took:>8.1f}")
    errs = sorted(x for x, _ in errors)
    worst = max(errors)
    print(f"\n{len(errors)} runs: median |error| {statistics.median(errs):.1%}, worst {worst[0]:.1%} ({worst[1]}); "
          f"within 15%: {sum(x <= 0.15 for x in errs)}, within 35%: {sum(x <= 0.35 for x in errs)}")
    print(f"total {time.perf_counter() - t_all:.0f} s")


if __name__ == "__main__":
    main()
