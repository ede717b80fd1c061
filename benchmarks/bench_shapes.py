"""The CPU step model's shape classes (issue 42): what the tall-skinny matmul sweep and the
L2-evicted bandwidth sweep cost a calibration, and how the expected step of the Lab's GPT grows
with its micro-batch under this CPU's cached calibration, op category by category.

The cost: the calibration's compute trials with and without the shape trials, made and timed in
one process, alternated (`--repeats` pairs), the machine's load printed beside them: compare the
ratio. The growth: ``lab.expect(micro_batch=...)`` at /2, x1, x2 from the cached stream record (no
run: the model alone), against what a step measured (RESULTS.md: matmuls 2.07-2.32x, elementwise
2.0-2.2x per doubling, a busy session's trace; measure again with bench_expect.py --quick --mb).

    .venv/bin/python benchmarks/bench_shapes.py               # both
    .venv/bin/python benchmarks/bench_shapes.py --cost        # the calibration's cost only
    .venv/bin/python benchmarks/bench_shapes.py --growth      # the expected growth only
"""
import argparse
import collections
import os
import time
import warnings

warnings.filterwarnings("ignore")


def load() -> str:
    return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"


def cost(repeats: int) -> None:
    import torch

    from tunekit.measure import step_compute
    from tunekit.measure.step_host import SIZES, WARM_SIZES, _cold_trial, _flush_bytes, _saved_pool, cache_levels
    from tunekit.measure.trials import fastest, rounds

    def _cold_op_s(n, flush, ops=None):   # the sweep's figure alone: its trials back to back
        return fastest(_cold_trial(n, flush, pool, ops).run)

    pool = _saved_pool()

    kinds = (("fp32", torch.float32), ("bf16", torch.bfloat16))
    print(f"calibration's compute trials, with and without the shape sweep ({load()})")
    for i in range(repeats):
        got = {}
        for with_shapes in (False, True):
            step_compute.SHAPE_KINDS = ("fp32",) if with_shapes else ()
            t0 = time.perf_counter()
            rounds(step_compute.compute_trials(kinds))
            got[with_shapes] = time.perf_counter() - t0
        levels = cache_levels()
        l2, l3 = levels.get(2), max(levels.values(), default=None)
        t0 = time.perf_counter()
        if l2 and l3:
            flush = torch.empty(l2)   # as measure.step_host.host_trials: 4 x L2 bytes, the saved tensors <= L3 / 4
            for n in WARM_SIZES:
                _cold_op_s(n, flush, ops=max(2, min(50, l3 // 4 // n)))
        warm_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        flush = torch.empty(_flush_bytes() // 4)
        for n in SIZES:
            _cold_op_s(n, flush)
        del flush
        cold_s = time.perf_counter() - t0
        print(f"  pair {i + 1}: without {got[False]:.1f} s, with {got[True]:.1f} s: the shapes add "
              f"{got[True] - got[False]:.1f} s ({got[True] / got[False]:.2f}x); the L2-evicted sweep {warm_s:.1f} s "
              f"beside the cold sweep's {cold_s:.1f} s ({warm_s / cold_s:.2f}x); "
              f"{load()}", flush=True)
    step_compute.SHAPE_KINDS = ("fp32",)


def growth() -> None:
    import tunekit
    from tunekit.measure.stream import measure_stream

    st = measure_stream()
    print(f"\nexpected step of GPT cpu-tiny (seq 128) by micro-batch, from the cached calibration "
          f"({st.verdict}, taken at load {getattr(st.conditions, 'load_avg', float('nan')):.1f})")
    lab = tunekit.Lab(micro_batch=8, seq_len=128, log_path="/tmp/bench_shapes.jsonl")
    by = {}
    for mb in (4, 8, 16):
        c = collections.Counter()
        for r in lab.expect(micro_batch=mb).rows:
            c[r[1]] += r[5]
        c["step"] = sum(c.values())
        by[mb] = c
    print(f"{'category':<14}{'mb 4 ms':>9}{'mb 8 ms':>9}{'mb 16 ms':>10}{'x2':>7}{'/2':>7}")
    for k in by[8]:
        print(f"{k:<14}{by[4][k] * 1e3:>9.2f}{by[8][k] * 1e3:>9.2f}{by[16][k] * 1e3:>10.2f}"
              f"{by[16][k] / by[8][k]:>7.3f}{by[4][k] / by[8][k]:>7.3f}")


def parse_args(argv=None) -> argparse.Namespace:
    """The command line (``argv``, else sys.argv's): an unknown option is refused before any work."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cost", action="store_true", help="the calibration's cost only (neither flag: both)")
    ap.add_argument("--growth", action="store_true", help="the expected growth only (neither flag: both)")
    ap.add_argument("--repeats", type=int, default=2, help="pairs of calibrations timed (default 2)")
    return ap.parse_args(argv)


def main(args: argparse.Namespace):
    both = not (args.cost or args.growth)
    if both or args.cost:
        cost(args.repeats)
    if both or args.growth:
        growth()


if __name__ == "__main__":
    main(parse_args())
