"""Estimated vs measured memory anatomy, side by side in one run: the built-in GPT, then
transformers Llama-, GPT-2- and Qwen2-style models built from configs (when transformers is
installed).

Targets: weights + gradients + optimizer states within 10% of measured, saved activations
(weight casts included) within 15% for the built-in GPT and 10% for the transformers models,
across fp32/bf16 x checkpointing x sdpa/eager. Exits 1 if a target is missed.
Usage: `python benchmarks/bench_memory_estimate.py` (CPU: preset cpu-small; CUDA: gpt2-124m,
plus allocator peak and NVML readings).
"""
from __future__ import annotations

import argparse
import sys

if __name__ == "__main__":   # no options: --help, or refused, before the heavy imports (test_bench_args.py)
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()

import torch

from tunekit.core.memory.estimate import estimate_memory, worked_example_147m
from tunekit.measure.memory import measure_memory
from tunekit.models.gpt import GPT, GPTConfig

GiB, GB = 2**30, 1e9
STATIC = ("weights", "gradients", "optimizer_states")
ACTS = ("activations", "weight_casts")


def main() -> int:
    cuda = torch.cuda.is_available()
    preset, b, s = ("gpt2-124m", 8, 1024) if cuda else ("cpu-small", 4, 256)
    dev = "cuda" if cuda else "cpu"
    print(f"device {dev}; preset {preset}; micro_batch {b}, seq_len {s}; sizes in MiB (2^20 bytes)")
    head = (f"{'attention':>9} {'precision':>9} {'ckpt':>5} | {'static est':>10} {'meas':>10} {'ratio':>6}"
            f" | {'acts est':>9} {'meas':>9} {'ratio':>6} | {'doc formula':>11}")
    if cuda:
        head += f" | {'peak':>8} {'other':>8} {'nvml':>8}"
    print(head)
    missed = []
    for attention in ("sdpa", "math"):
        model = GPT(GPTConfig.preset(preset, attention=attention)).to(dev)
        for precision in ("fp32", "bf16"):
            for ck in (False, True):
                rep = measure_memory(model, precision=precision, checkpointing=ck,
                                     micro_batch=b, seq_len=s)
                se, sm = (sum(d[k] for k in STATIC) for d in (rep.estimate.components, rep.measured))
                ae, am = (sum(d[k] for k in ACTS) for d in (rep.estimate.components, rep.measured))
                rs, ra = se / sm, ae / am
                # the documents' s*b*h*L*(34 + 5as/h) (2-byte elements, dropout masks, no flash)
                doc = estimate_memory(model.config, layout="amp" if precision == "bf16" else "fp32",
                                      micro_batch=b, seq_len=s, checkpointing=ck,
                                      activations="korthikanti", device="cpu")["activations"]
                line = (f"{attention:>9} {precision:>9} {str(ck):>5} | {se / 2**20:10.1f} {sm / 2**20:10.1f}"
                        f" {rs:6.4f} | {ae / 2**20:9.1f} {am / 2**20:9.1f} {ra:6.4f} | {doc / 2**20:11.1f}")
                if cuda:
                    c = rep.cuda
                    line += (f" | {c['allocator_peak'] / 2**20:8.1f} {c['other'] / 2**20:8.1f}"
                             f" {c['nvml_used'] / 2**20:8.1f}")
                print(line)
                if abs(rs - 1) > 0.10:
                    missed.append(f"static {attention}/{precision}/ck={ck}: ratio {rs:.3f}")
                if abs(ra - 1) > 0.15:
                    missed.append(f"activations {attention}/{precision}/ck={ck}: ratio {ra:.3f}")
        del model
    missed += transformers_table(dev)
    print("\nThe documents' 147M GPT example at batch 64 (GB = 1e9 bytes, GiB = 2^30):")
    for name, est in worked_example_147m(64).items():
        print(f"  {name:>28}: static {est.static_bytes / GB:6.3f} GB, total {est.total_bytes / GB:6.2f} GB"
              f" ({est.total_bytes / GiB:5.2f} GiB)")
    print("\n" + ("all targets met" if not missed else "MISSED: " + "; ".join(missed)))
    return 1 if missed else 0


def transformers_table(dev) -> list:
    """The same comparison on transformers decoders (random init from configs)."""
    try:
        import transformers
        from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, Qwen2Config
    except ImportError:
        print("\ntransformers is not installed: its table is skipped (pip install -e '.[hf]')")
        return []
    transformers.logging.set_verbosity_error()
    from tunekit.lab.lab import Lab

    cfgs = {"llama": LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=688,
                                 num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                                 max_position_embeddings=512),
            "gpt2": GPT2Config(vocab_size=2048, n_embd=256, n_layer=4, n_head=8, n_positions=512),
            "qwen2": Qwen2Config(vocab_size=2048, hidden_size=256, intermediate_size=704,
                                 num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                                 max_position_embeddings=512)}
    b, s = 4, 256
    print(f"\ntransformers {transformers.__version__}; micro_batch {b}, seq_len {s}; MiB")
    print(f"{'model':>6} {'attention':>9} {'precision':>9} {'ckpt':>5} | {'static est':>10} {'meas':>10}"
          f" {'ratio':>6} | {'acts est':>9} {'meas':>9} {'ratio':>6}")
    missed = []
    for name, cfg in cfgs.items():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg).to(dev)
        for attention in ("sdpa", "eager"):
            for precision in ("fp32", "bf16"):
                for ck in (False, True):
                    lab = Lab(model, log_path=f"/tmp/tunekit-bench-{name}.jsonl", peak_tflops=1.0,
                              micro_batch=b, seq_len=s, precision=precision, checkpointing=ck,
                              attention=attention)
                    rep = measure_memory(lab)
                    se, sm = (sum(d[k] for k in STATIC) for d in (rep.estimate.components, rep.measured))
                    ae, am = (sum(d[k] for k in ACTS) for d in (rep.estimate.components, rep.measured))
                    print(f"{name:>6} {attention:>9} {precision:>9} {str(ck):>5} | {se / 2**20:10.1f}"
                          f" {sm / 2**20:10.1f} {se / sm:6.4f} | {ae / 2**20:9.1f} {am / 2**20:9.1f}"
                          f" {ae / am:6.4f}")
                    if abs(se / sm - 1) > 0.10 or abs(ae / am - 1) > 0.10:
                        missed.append(f"{name} {attention}/{precision}/ck={ck}: {se / sm:.3f}, {ae / am:.3f}")
    return missed


if __name__ == "__main__":
    from tunekit.measure.conditions import watch

    with watch() as machine:  # what else used the machine meanwhile: a busy run is no measurement
        rc = main()
    print(f"machine while this ran: {machine.conditions}")
    sys.exit(rc)
