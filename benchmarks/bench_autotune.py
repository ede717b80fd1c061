"""lab.autotune against the exhaustive grid over the same space, on CPU with the demo GPT.

Targets (issue 13): autotune's winner within 5% of the grid's best tokens/s, in at most a quarter
of the grid's time; the same winner in at least 4 of 5 repeats unless the top two are within
noise (and then autotune says so).

1. The grid: every legal, distinct configuration of the space autotune searches (precision,
   attention, optimizer kernel, checkpointing, micro-batch), each measured ``--grid-repeats``
   times with the trials autotune uses (``lab.run``: ``steps`` timed steps, then enough to fill
   ``trial_s``), scored the same way (the best repeat's best-step tokens/s). torch.compile is
   left out of both sides: on this CPU its first compile of the demo GPT alone takes ~35 s, per
   configuration on the grid's side.
2. autotune, ``--repeats`` times, each on a fresh Lab with a budget of a quarter of the grid's
   time. Its winner is looked up in the grid's table, so both are judged by the same measurement.

    .venv/bin/python benchmarks/bench_autotune.py [--threads 1]   # ~10-15 min on 2 shared cores
    .venv/bin/python benchmarks/bench_autotune.py --quick         # smaller: micro-batch <= 8, 2 runs
"""
import argparse
import os
import tempfile
import time
from collections import Counter


def parse_args(argv=None) -> argparse.Namespace:
    """The options, read before the heavy imports below: a refused one costs none of them."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller: micro-batch <= 8, 2 autotune runs")
    ap.add_argument("--repeats", type=int, default=None, help="autotune runs (default 5; quick: 2)")
    ap.add_argument("--grid-repeats", type=int, default=3)
    ap.add_argument("--trial-s", type=float, default=0.25, help="autotune's trial_s, also for the grid")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--max-micro-batch", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads (default: torch's). On an oversubscribed machine 1 "
                         "avoids threads waiting on a descheduled sibling (100x slower runs were seen)")
    return ap.parse_args(argv)


if __name__ == "__main__":   # the options first (tests/project/test_bench_args.py)
    ARGS = parse_args()

import tunekit  # noqa: F401, I001  (tunekit before torch: it quiets the deprecated pynvml shim's warning)
import torch

from tunekit.core import registry
from tunekit.lab.lab import Lab
from tunekit.autotune import Candidate, timed_steps
from tunekit.core.toggles import label


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores"


def grid_space(lab, limit: int):
    """The configurations autotune's rules start from, before its pruning: legal and distinct."""
    env, start = lab.env(), lab.resolve()
    precisions = [p for p in registry.PRECISIONS if not (p == "tf32" and env.device_type != "cuda")]
    attentions = [a for a in registry.ATTENTIONS if a != "flash" or env.flash_installed]
    algo = registry.optimizer(start.optimizer).factory
    optimizers = [o for o in registry.LAB_OPTIMIZERS if registry.OPTIMIZERS[o].factory == algo]
    sizes = sorted({2 ** k for k in range(limit.bit_length()) if 2 ** k <= limit} | {limit})
    out = []
    for p in precisions:
        for a in attentions:
            for o in optimizers:
                for ckpt in (False, True):
                    for b in sizes:
                        t = start.replace(precision=p, attention=a, optimizer=o, checkpointing=ckpt, micro_batch=b)
                        if not lab.check(t):
                            out.append(t)
    return out


def key(t):
    return (t.precision, t.attention, t.optimizer, t.checkpointing, t.micro_batch)


def main(args: argparse.Namespace):
    if args.threads:
        torch.set_num_threads(args.threads)
    seq = args.seq_len or 32
    limit = args.max_micro_batch or (8 if args.quick else 16)
    repeats = args.repeats or (2 if args.quick else 5)
    logs = tempfile.mkdtemp(prefix="bench-autotune-")
    make = lambda i: Lab(preset="cpu-tiny", seq_len=seq, log_path=f"{logs}/lab{i}.jsonl")  # noqa: E731

    print(f"bench_autotune: cpu-tiny GPT, seq_len={seq}, micro-batch <= {limit}, {args.steps} timed "
          f"steps + 1 warm-up per trial, {torch.get_num_threads()} torch thread(s); compile excluded "
          "from both sides")
    print(f"NOTE: this machine is shared with other engineers' jobs; at start: {load()}. "
          "Timings on it are noisy (contention only adds time; scores use each run's fastest step).")

    lab = make("grid")
    space = grid_space(lab, limit)
    t0 = time.perf_counter()
    grid = {key(t): Candidate("grid", t) for t in space}
    # repeats in rounds over all configurations, as autotune's races do: a burst of load that
    # lasts tens of seconds then slows one repeat of many configurations, not every repeat of one
    for rnd in range(args.grid_repeats):
        for c in grid.values():
            # the same trials as autotune's: the first of `steps`, then enough to fill trial_s
            n = timed_steps(c.runs[0].step_s, args.steps, args.trial_s) if c.runs else args.steps
            c.runs.append(lab.run(steps=n, warmup=1, verbose=False, **c.toggles.asdict()))
        print(f"  grid: round {rnd + 1}/{args.grid_repeats} over {len(space)} configurations, "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
    grid_s = time.perf_counter() - t0
    ranked = sorted(grid.values(), key=lambda c: c.score, reverse=True)
    best = ranked[0]
    start = lab.resolve()
    print(f"\ngrid: {len(space)} configurations x {args.grid_repeats} repeats in {grid_s:.1f} s ({load()})")
    print("  top 5:")
    for c in ranked[:5]:
        print(f"    {label(c.toggles, start):32s} {c.score:>10,.0f} tokens/s  ({c.score / best.score:.3f}x best)")

    budget = grid_s / 4
    print(f"\nautotune x{repeats}, each on a fresh Lab with budget_s = grid time / 4 = {budget:.1f} s:")
    print(f"  {'#':>2} {'winner':32s} {'grid tokens/s':>14} {'vs grid best':>12} {'time':>8} "
          f"{'time/grid':>9} {'trials':>6}  status, noise")
    winners, rows = [], []
    for i in range(repeats):
        tl = make(i)
        found = tl.autotune(budget_s=budget, space={"compile": [False]}, max_micro_batch=limit,
                            steps=args.steps, warmup=1, trial_s=args.trial_s)
        w = found.toggles
        g = grid.get(key(w)) if w is not None else None
        ratio = g.score / best.score if g else float("nan")
        trials = int(found.evidence["repeats"].sum())
        noise = f"top two within noise (±{found.band:.0%}): {label(found.runner_up, start)}" \
            if found.within_noise else "clear winner"
        if found.close_calls:
            noise += "; close calls: " + "; ".join(found.close_calls)
        winners.append(key(w) if w else None)
        rows.append((ratio, found.elapsed_s / grid_s, found.within_noise or bool(found.close_calls)))
        print(f"  {i + 1:>2} {label(w, start) if w else '-':32s} {g.score if g else float('nan'):>14,.0f} "
              f"{ratio:>11.3f}x {found.elapsed_s:>7.1f}s {found.elapsed_s / grid_s:>8.1%} {trials:>6}  "
              f"{found.status}, {noise}")
    common, n = Counter(winners).most_common(1)[0]
    ok_speed = all(r >= 0.95 for r, _, _ in rows)
    ok_time = all(f <= 0.25 for _, f, _ in rows)
    noisy = any(w for _, _, w in rows)
    print(f"\nsummary ({load()}):")
    print(f"  winner within 5% of the grid's best: {sum(r >= 0.95 for r, _, _ in rows)}/{repeats} "
          f"(worst {min(r for r, _, _ in rows):.3f}x) -> {'PASS' if ok_speed else 'FAIL'}")
    print(f"  time <= 1/4 of the grid's: {sum(f <= 0.25 for _, f, _ in rows)}/{repeats} "
          f"(longest {max(f for _, f, _ in rows):.1%} of {grid_s:.1f} s) -> {'PASS' if ok_time else 'FAIL'}")
    same = f"same winner in {n}/{repeats}"
    verdict = "PASS" if n >= 0.8 * repeats else ("within noise (autotune said so)" if noisy else "FAIL")
    print(f"  {same} ({label(grid[common].toggles, start) if common in grid else common}) -> {verdict}")


if __name__ == "__main__":
    main(ARGS)
