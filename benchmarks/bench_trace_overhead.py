"""What tracing costs: a training step untraced, traced (``--trace``) and traced with the memory
profiler (``--memory``), alternated in rounds on one model so drift hits all three alike.

Each round times one step of each kind (device-synchronized); the ratios of the medians are the
profiler's overhead inside the clock. The work after the clock (reading the events, the memory
profile, writing the Chrome trace) is timed separately: the user waits for it too. Also checks
that the categories add up to the traced wall time (target: within 10%).

    .venv/bin/python benchmarks/bench_trace_overhead.py [--rounds 7] [--micro-batch 4] [--seq 128]
"""
import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    """The options, read before the heavy imports below: a refused one costs none of them."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    return ap.parse_args(argv)


if __name__ == "__main__":   # the options first (tests/project/test_bench_args.py)
    ARGS = parse_args()

import torch

from tunekit.lab.lab import Lab
from tunekit.measure.timing import time_repeats
from tunekit.measure.trace import Tracer


def main(args: argparse.Namespace):
    if args.threads:
        torch.set_num_threads(args.threads)
    folder = Path(tempfile.mkdtemp(prefix="traces-"))
    lab = Lab(micro_batch=args.micro_batch, seq_len=args.seq, log_path=folder / "log.jsonl")
    t = lab.resolve()
    lab.apply(t)
    step = lambda: lab.train_step(t)  # noqa: E731
    time_repeats(step, warmup=2, repeats=1)
    times = {"plain": [], "trace": [], "trace+memory": []}
    read = {"trace": [], "trace+memory": []}
    sums = []
    load0 = os.getloadavg()[0]
    kinds = list(times)
    for r in range(args.rounds):
        for kind in kinds[r % 3:] + kinds[:r % 3]:  # rotate the order: no kind always runs first
            if kind == "plain":
                times["plain"].append(time_repeats(step, warmup=0, repeats=1)[0])
                continue
            tr = Tracer("bench", trace=True, memory=kind == "trace+memory", folder=folder).start()
            wall = time_repeats(step, warmup=0, repeats=1)[0]
            t0 = time.perf_counter()
            b, _ = tr.stop(wall)
            read[kind].append(time.perf_counter() - t0)
            times[kind].append(wall)
            sums.append(b.total_s() / b.wall_s)
    load1 = os.getloadavg()[0]
    base = statistics.median(times["plain"])
    print(f"cpu-tiny, micro_batch={args.micro_batch}, seq_len={args.seq}, {torch.get_num_threads()} threads, "
          f"{args.rounds} rotating rounds; "
          f"load average {load0:.1f} -> {load1:.1f} on {os.cpu_count()} cores"
          + ("  (MACHINE LOADED: ratios are noisy)" if max(load0, load1) > 0.75 * os.cpu_count() else ""))
    print(f"{'kind':<14}{'median step (ms)':>18}{'vs plain':>10}{'read after (ms)':>17}")
    for kind, ts in times.items():
        m = statistics.median(ts)
        after = f"{statistics.median(read[kind]) * 1e3:17.1f}" if kind in read else f"{'-':>17}"
        print(f"{kind:<14}{m * 1e3:18.1f}{m / base:10.2f}{after}")
    print(f"categories / traced wall time: {min(sums):.3f} .. {max(sums):.3f} (target 0.90 .. 1.10)")


if __name__ == "__main__":
    from tunekit.measure.conditions import watch

    with watch() as machine:  # what else used the machine meanwhile: a busy run is no measurement
        main(ARGS)
    print(f"machine while this ran: {machine.conditions}")
