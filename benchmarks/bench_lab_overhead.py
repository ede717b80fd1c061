"""How much of a Lab step is the Lab's own work, on CPU (target < 3%): the cpu-tiny preset, or
with ``--model llama`` a transformers Llama-style model built from a config.

Two measurements side by side, in one process, on one model and optimizer:
1. end to end: a bare loop (forward, backward, optimizer step, zero_grad on pre-made batches)
   against ``lab.run`` with the same shapes; rounds alternate so drift hits both alike;
2. direct: the Lab's per-step extras alone (drawing a batch, the synchronized clock reads,
   the autocast context, the loss bookkeeping), timed without the model.
The end-to-end ratio carries the machine's noise (a shared CPU moves a few %); the direct one
says what the Lab itself adds.

    .venv/bin/python benchmarks/bench_lab_overhead.py [--steps 20] [--rounds 5] [--model llama]
"""
import argparse
import statistics
import tempfile
import time


def parse_args(argv=None) -> argparse.Namespace:
    """The options, read before the heavy imports below: a refused one costs none of them."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--model", choices=["cpu-tiny", "llama"], default="cpu-tiny")
    return ap.parse_args(argv)


if __name__ == "__main__":   # the options first (tests/project/test_bench_args.py)
    ARGS = parse_args()

import torch

from tunekit.lab.lab import Lab
from tunekit.measure.device import now_s
from tunekit.train.precision import autocast, matmul_precision


def bare_steps(lab, batches, hf: bool) -> float:
    """Mean seconds per step of the minimal training loop."""
    model, opt = lab.model, lab.optimizer
    t0 = time.perf_counter()
    for x, y in batches:
        if hf:
            loss = model(input_ids=x, labels=y, shift_labels=y, use_cache=False).loss
        else:
            _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return (time.perf_counter() - t0) / len(batches)


def lab_extras(lab, t, n: int) -> float:
    """Mean seconds of what lab.train_step and lab.measure_steps do per step besides
    forward/backward/step: clock reads, batch, scaler lookup, precision contexts, loss keeping."""
    fake_loss = torch.tensor(1.0)
    losses = []
    t0 = time.perf_counter()
    for _ in range(n):
        a = now_s(lab.device)
        lab.grad_scaler(t)
        with matmul_precision(t, lab.device):
            x, y = lab.batch_fn(t.micro_batch, t.seq_len)
            with autocast(t, lab.device):
                pass
        losses.append(fake_loss.detach())
        _ = now_s(lab.device) - a
    return (time.perf_counter() - t0) / n


def main(args: argparse.Namespace):
    hf = args.model == "llama"
    model = None
    if hf:
        import transformers
        from transformers import AutoModelForCausalLM, LlamaConfig

        transformers.logging.set_verbosity_error()
        model = AutoModelForCausalLM.from_config(LlamaConfig(
            vocab_size=256, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128))
    with tempfile.TemporaryDirectory() as tmp:
        lab = Lab(model, preset="cpu-tiny", log_path=f"{tmp}/runs.jsonl", peak_tflops=1.0)
        t = lab.resolve()
        lab.run(steps=3, warmup=2, verbose=False)  # builds the optimizer, counts FLOPs, warms the kernels
        bare, full = [], []
        for _ in range(args.rounds):
            batches = [lab.batch(t.micro_batch, t.seq_len) for _ in range(args.steps)]
            bare.append(bare_steps(lab, batches, hf))
            full.append(lab.run(steps=args.steps, warmup=0, verbose=False).step_s)
        extras_s = lab_extras(lab, t, 2000)
    bare_s, lab_s = statistics.median(bare), statistics.median(full)
    print(f"{args.model}, micro_batch={t.micro_batch}, seq_len={t.seq_len}, {torch.get_num_threads()} threads, "
          f"{args.rounds} rounds x {args.steps} steps")
    print(f"{'':28}{'median':>10}{'best':>10}")
    print(f"{'bare loop step (ms)':28}{bare_s * 1e3:10.3f}{min(bare) * 1e3:10.3f}")
    print(f"{'lab.run step (ms)':28}{lab_s * 1e3:10.3f}{min(full) * 1e3:10.3f}")
    print(f"end-to-end overhead  lab/bare - 1 = {lab_s / bare_s - 1:+.2%} (median), "
          f"{min(full) / min(bare) - 1:+.2%} (best)")
    print(f"direct overhead      {extras_s * 1e6:.1f} us per step = {extras_s / bare_s:.2%} of a bare step")
    verdict = "PASS" if extras_s / bare_s < 0.03 and min(full) / min(bare) - 1 < 0.03 else "CHECK"
    print(f"target < 3%: {verdict}")


if __name__ == "__main__":
    from tunekit.measure.conditions import watch

    with watch() as machine:  # what else used the machine meanwhile: a busy run is no measurement
        main(ARGS)
    print(f"machine while this ran: {machine.conditions}")
