"""Why a bigger micro-batch grows the built-in GPT's CPU step by more than the matmul sweeps say
(issue 42, item 3, part B): the measured step grew 2.07-2.32x per doubling of the micro-batch where
the plan's matmul sweeps expect 1.93x. This traces real training steps at two micro-batches (the
preset bench_expect.py uses: cpu-tiny, seq 128; mb 8 and 16), alternating the two and repeating, and
prints op by op the self CPU time per step at each size and its growth (the matmuls also by shape,
the token dimension written T), with the step's untraced time and its minor page faults (the kernel
handing the process fresh zeroed pages: what a working set that glibc's heap does not keep costs
every step), also op by op (counted in ``FAULTED`` more steps under a dispatch mode reading the
process's fault count around each op: which ops write their output into fresh pages; bench_cache_reads.py
times an op so). The timed steps start as lab.run's do, after the peak meter's malloc_trim.

    .venv/bin/python benchmarks/bench_mb_growth.py                 # mb 8 against 16, 4 rounds
    .venv/bin/python benchmarks/bench_mb_growth.py --mb 4 8 --rounds 6
    .venv/bin/python benchmarks/bench_mb_growth.py --gpt2          # bench_expect's GPT-2 4x128, mb 4, seq 64 vs 128
    .venv/bin/python benchmarks/bench_mb_growth.py --priority      # each size's block ahead of other work
    MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824 \\
        .venv/bin/python benchmarks/bench_mb_growth.py             # glibc keeps every freed page

(glibc ignores an mmap threshold above 32 MiB on 64-bit, and a trim threshold given alone fixes the
mmap threshold at its 128 KiB default: every tensor above it mapped and faulted in anew, 44k faults a
step at mb 16 against 1-8k by default, 2026-12-07. With the two above, the steps after the first
fault ~0-200 pages at mb 8 and 16.)

Each round: for each size, ``WARMUP`` untraced steps, ``STEPS`` untraced timed steps (their median,
and the page faults per step), then ``TRACED`` steps under torch.profiler, then ``FAULTED`` steps
counting each op's page faults. An op's time per size is its smallest over the rounds (the machine's
other work only slows a round); its faults per step, their median over the rounds.
"""
import argparse
import os
import resource
import statistics
import tempfile
import time
import warnings
from collections import defaultdict
from contextlib import nullcontext
from pathlib import Path

WARMUP, STEPS, TRACED, FAULTED, ROUNDS = 3, 10, 3, 3, 4


def parse_args(argv=None) -> argparse.Namespace:
    """The command line (``argv``, else sys.argv's): an unknown option is refused before any work."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, nargs=2, default=[8, 16], metavar=("SMALL", "BIG"),
                    help="the two micro-batches (default 8 16)")
    ap.add_argument("--gpt2", action="store_true", help="bench_expect's GPT-2 4x128 at mb 4, two sequence lengths")
    ap.add_argument("--seq", type=int, nargs=2, default=[64, 128], metavar=("SMALL", "BIG"),
                    help="with --gpt2: the two sequence lengths (default 64 128)")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help=f"rounds (default {ROUNDS})")
    ap.add_argument("--priority", action="store_true", help="each size's block ahead of other work")
    return ap.parse_args(argv)


if __name__ == "__main__":   # the options first (tests/project/test_bench_args.py)
    ARGS = parse_args()

import torch

import tunekit
from tunekit.measure.meters import malloc_trim
from tunekit.measure.priority import ahead

warnings.filterwarnings("ignore")


def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def untraced(lab, t, steps: int) -> tuple[float, float, float, float]:
    """(median step seconds, minor page faults of the first step, per step of the rest, seconds per
    page fault) of ``steps`` steps, started as lab.run's timed steps start: the heaps' freed pages
    handed back (the peak meter's malloc_trim, measure.device_meter). The seconds a fault costs: the
    first step's time beyond the median over its faults beyond the median (the same step, refaulting
    the pages the trim handed back)."""
    malloc_trim()
    times, counts = [], []
    for _ in range(steps):
        f0, t0 = faults(), time.perf_counter()
        lab.train_step(t)
        times.append(time.perf_counter() - t0)
        counts.append(faults() - f0)
    per_fault = (times[0] - statistics.median(times[1:])) / max(counts[0] - statistics.median(counts[1:]), 1)
    return statistics.median(times), counts[0], statistics.mean(counts[1:]), per_fault


def traced(lab, t, steps: int) -> dict:
    """Self CPU seconds per step of each op (by name) over ``steps`` profiled steps."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(steps):
            lab.train_step(t)
    out = {e.key: e.self_cpu_time_total / 1e6 / steps for e in prof.key_averages()}
    tokens = str(t.micro_batch * t.seq_len)
    for e in prof.key_averages(group_by_input_shape=True):   # each matmul shape, its tokens written T
        if e.key == "aten::mm":
            shapes = str(e.input_shapes).replace(tokens, "T").replace(" ", "")
            out[f"mm {shapes}"] = e.self_cpu_time_total / 1e6 / steps
    return out


def faulted(lab, t, steps: int) -> dict:
    """Minor page faults per step of each op (by name, as the profiler names it) over ``steps`` steps:
    the process's fault count read around each op under a dispatch mode (the counts, not the times)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    counts: dict = defaultdict(int)

    class Faults(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            f0 = faults()
            out = func(*args, **(kwargs or {}))
            counts[f"aten::{func.overloadpacket.__name__}"] += faults() - f0
            return out

    with Faults():
        for _ in range(steps):
            lab.train_step(t)
    return {op: n / steps for op, n in counts.items()}


def main(args: argparse.Namespace):
    gpt2 = args.gpt2
    small, big = args.seq if gpt2 else args.mb
    unit, toggle = ("seq", "seq_len") if gpt2 else ("mb", "micro_batch")
    rounds = args.rounds
    env = {k: v for k, v in os.environ.items() if k.startswith(("MALLOC_", "GOMP_", "OMP_"))}
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; {env or 'glibc and libgomp defaults'}")
    with tempfile.TemporaryDirectory(prefix="bench_mb_growth-") as folder:
        log = str(Path(folder) / "runs.jsonl")
        lab = gpt2_lab(small, log) if gpt2 else tunekit.Lab(micro_batch=small, seq_len=128, log_path=log)
        sizes = {mb: lab.resolve(**{toggle: mb}) for mb in (small, big)}
        step = {mb: [] for mb in sizes}
        fault = {mb: [] for mb in sizes}
        first_fault = {mb: [] for mb in sizes}
        per_fault: list = []
        ops: dict = {mb: defaultdict(list) for mb in sizes}
        op_faults: dict = {mb: defaultdict(list) for mb in sizes}
        for r in range(rounds):
            for mb, t in (sizes.items() if r % 2 == 0 else reversed(sizes.items())):
                with ahead() if args.priority else nullcontext():
                    lab.apply(t)
                    for _ in range(WARMUP):
                        lab.train_step(t)
                    s, first, f, cost = untraced(lab, t, STEPS)
                    per_fault.append(cost)
                    per_op = traced(lab, t, TRACED)
                    for op, n in faulted(lab, t, FAULTED).items():
                        op_faults[mb][op].append(n)
                step[mb].append(s)
                fault[mb].append(f)
                first_fault[mb].append(first)
                for op, secs in per_op.items():
                    ops[mb][op].append(secs)
            print(f"round {r + 1}: " + ", ".join(f"{unit} {mb} {step[mb][-1] * 1e3:.1f} ms, page faults first step "
                                                  f"{first_fault[mb][-1]}, then {fault[mb][-1]:.0f}/step"
                                                  for mb in sizes), flush=True)
    report(small, big, step, fault, ops, op_faults, unit)
    cost = statistics.median(per_fault)
    print(f"a page fault costs {cost * 1e6:.2f} us (median over the blocks; the first step after the trim "
          "against the rest): the faults after the first step cost "
          + ", ".join(f"{statistics.median(fault[mb]) * cost * 1e3:.2f} ms/step at {unit} {mb}" for mb in sizes))


def gpt2_lab(seq: int, log_path: str):
    """bench_expect.py's GPT-2 4x128 (transformers, random init) at micro-batch 4."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=512, n_embd=128, n_layer=4, n_head=4, n_positions=256)
    return tunekit.Lab(GPT2LMHeadModel(cfg), micro_batch=4, seq_len=seq, log_path=log_path)


def report(small, big, step, fault, ops, op_faults, unit="mb") -> None:
    a, b = min(step[small]), min(step[big])
    print(f"\nuntraced step (fastest round's median): {unit} {small} {a * 1e3:.1f} ms, {unit} {big} {b * 1e3:.1f} ms: "
          f"{b / a:.2f}x; minor page faults per step {min(fault[small]):.0f} -> {min(fault[big]):.0f}")
    rows = []
    for op in set(ops[small]) | set(ops[big]):
        x, y = min(ops[small].get(op, [0.0])), min(ops[big].get(op, [0.0]))
        rows.append((op, x, y))
    total_x, total_y = (sum(r[i] for r in rows if not r[0].startswith("mm ")) for i in (1, 2))
    print(f"traced self CPU per step: {unit} {small} {total_x * 1e3:.1f} ms, {unit} {big} {total_y * 1e3:.1f} ms: "
          f"{total_y / total_x:.2f}x")
    print(f"{'op':<44}{f'{unit} {small} ms':>10}{f'{unit} {big} ms':>10}{'growth':>8}{'extra ms':>10}"
          f"{'faults/step':>14}  (extra: beyond 2x; page faults in the op, per step: {unit} {small} -> {big})")

    def faults_of(mb, op):
        return statistics.median(op_faults[mb][op]) if op_faults[mb].get(op) else 0.0

    for op, x, y in sorted(rows, key=lambda r: -(r[2] - 2 * r[1]))[:30]:
        print(f"{op[:43]:<44}{x * 1e3:>10.2f}{y * 1e3:>10.2f}{(y / x if x else float('nan')):>8.2f}"
              f"{(y - 2 * x) * 1e3:>+10.2f}{faults_of(small, op):>7.0f}{faults_of(big, op):>7.0f}")
    every = [sum(faults_of(mb, op) for op in op_faults[mb]) for mb in (small, big)]
    print(f"{'all ops':<44}{total_x * 1e3:>10.2f}{total_y * 1e3:>10.2f}{total_y / total_x:>8.2f}"
          f"{(total_y - 2 * total_x) * 1e3:>+10.2f}{every[0]:>7.0f}{every[1]:>7.0f}")


if __name__ == "__main__":
    main(ARGS)
