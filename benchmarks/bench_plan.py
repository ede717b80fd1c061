"""tunekit.plan: how long a plan takes, how much real memory it uses, and its bounds beside
published measurements (issue 23).

1. An 8B Llama-3-shaped config (vocab 128,256, hidden 4,096, 32 layers, 32 heads, 8 KV heads,
   d_ff 14,336) planned for one H100 SXM, bf16 weights + AdamW, micro-batch 1 x 8192, with full
   checkpointing: wall time and the process's peak RSS (target: under a minute, little memory).
2. The largest micro-batch that fits, found over fake steps (target: under 3 minutes).
3. The plan's speed-of-light bound beside published figures (../shared/facts.md): a measurement
   above its bound would be a modelling error.

    .venv/bin/python benchmarks/bench_plan.py
"""
import resource
import time
import warnings

from transformers import LlamaConfig

import tunekit

warnings.filterwarnings("ignore")
LLAMA3_8B = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192)


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main():
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
    nock = tunekit.plan(LLAMA3_8B, "H100 SXM", precision="bf16", weights="bf16", micro_batch=1, seq_len=8192)
    gpt2 = tunekit.plan(tunekit.GPTConfig.preset("gpt2-124m"), "H100 SXM", precision="bf16", micro_batch=16,
                        seq_len=1024)
    print("\nbound vs published (per GPU):")
    print(f"  torchtitan Llama 3.1 8B, 8xH100, 5,762 tokens/s/GPU (6,667 with compile), 33-39% MFU; plan: "
          f"<= {nock.bound_tokens_per_s:,.0f} tokens/s, MFU <= {nock.bound_mfu:.0%} without checkpointing, "
          f"<= {p.bound_tokens_per_s:,.0f} / {p.bound_mfu:.0%} with full checkpointing; measured/bound "
          f"{6667 / nock.bound_tokens_per_s:.2f} (compile, vs no checkpointing)")
    print(f"  GPT-2 124M (tunekit's preset) 16 x 1024 on H100: <= {gpt2.bound_tokens_per_s:,.0f} tokens/s, "
          f"MFU <= {gpt2.bound_mfu:.0%}; nanochat reports ~41-46% MFU for its d12/d18 on H100s")


if __name__ == "__main__":
    main()
