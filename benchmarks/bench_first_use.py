"""The memory a CPU kernel library keeps once per process (measure.first_use), and lab.expect's peak of
a first bf16 run after an fp32 base with and without it (issue 42: bench_expect's bf16 row missed its
peak by -6% on the Llama 4x128; a second bf16 run in the same process by -2%, as the fp32 rows).

1. This CPU's figures: a dtype's first matmul, each new matmul shape and a dtype's first attention,
   each the median of fresh child processes (measure.first_use; cached, ``--refresh`` measures again).
2. bench_expect's Llama 4x128 (micro_batch 4, seq_len 64): a traced fp32 base run, then ``--runs``
   bf16 runs; before each, lab.expect(precision="bf16") from the base run with the first-use bytes
   left out (before this model) and with them, against the run's measured peak.

Run with glibc keeping its freed heap pages, as bench_expect does (re-executed with
``train.record.TUNABLES`` unless set, or ``--glibc-heap``). Memory does not follow the CPU's load.

    .venv/bin/python benchmarks/bench_first_use.py
    .venv/bin/python benchmarks/bench_first_use.py --refresh --runs 2
"""
import argparse
import os
import sys
import tempfile
from pathlib import Path

MiB = 2**20


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--refresh", action="store_true", help="measure this CPU's first-use figures again")
    ap.add_argument("--runs", type=int, default=3, help="bf16 runs after the fp32 base (default 3)")
    ap.add_argument("--glibc-heap", action="store_true", help="glibc's heap defaults")
    return ap.parse_args(argv)


def figures(refresh: bool) -> None:
    from tunekit.measure.first_use import measure_first_use

    got = measure_first_use(refresh=refresh)
    print(f"this CPU's first-use figures ({got['verdict']} while measured), MiB, median of the children:")
    for dtype, f in got["figures"].items():
        each = ", ".join(f"{k} {v / MiB:.2f} ({'/'.join(f'{r[k] / MiB:.2f}' for r in got['repeats'][dtype])})"
                         for k, v in f.items())
        print(f"  {dtype}: {each}")


def llama(runs: int, log_path: str) -> None:
    import transformers

    import tunekit
    from tunekit.lab import expect_peak

    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=344, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    lab = tunekit.Lab(transformers.LlamaForCausalLM(cfg), micro_batch=4, seq_len=64, log_path=log_path)
    base = lab.run(steps=15, warmup=3, trace=True, verbose=False)
    print(f"fp32 base run: peak {base.peak_mem_bytes / MiB:.1f} MiB")
    real = expect_peak.first_use_of
    for i in range(1, runs + 1):
        expect_peak.first_use_of = lambda lab, plan: (0.0, [])   # lab.expect's peak before this model
        try:
            before = lab.expect(base=base, precision="bf16", verbose=False)
        finally:
            expect_peak.first_use_of = real
        after = lab.expect(base=base, precision="bf16", verbose=False)
        run = lab.run(precision="bf16", steps=10, warmup=3, verbose=False)
        m, was, now = run.peak_mem_bytes, before.peak_bytes, after.peak_bytes
        print(f"bf16 run {i}: measured {m / MiB:.1f} MiB; expected without first-use {was / MiB:.1f} "
              f"({was / m - 1:+.1%}), with {now / MiB:.1f} ({now / m - 1:+.1%})")
        for note in after.notes:
            if note.kind == "expect.first_use":
                print(f"  note: {note}")


def main(args: argparse.Namespace) -> None:
    from tunekit.train.record import TUNABLES, tunables_words

    if not args.glibc_heap and not any(k in os.environ for k in TUNABLES):
        print(f"re-executing with {tunables_words()} (glibc keeps freed heap pages; --glibc-heap: not)", flush=True)
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **TUNABLES})
    figures(args.refresh)
    with tempfile.TemporaryDirectory(prefix="bench_first_use-") as folder:
        llama(args.runs, str(Path(folder) / "runs.jsonl"))


if __name__ == "__main__":
    main(parse_args())
