"""Does the quiet/busy verdict tell a busy machine from a quiet one, and what does it cost? (issue 18)

1. Detection: rounds alternate quiet / busy (busy = two processes spinning on the 2 cores, started
   before the round and killed after it, so a quiet round follows a busy one at once: a verdict
   that lagged, like the load average, would fail here). Each round makes Lab runs (cpu-tiny, a
   few timed steps) and profiled blocks (`tunekit.profile` around one training step). Targets:
   >= 95% of the busy measurements flagged busy, <= 5% of the quiet ones.
2. Cost: the same trivial profiled block with the conditions meter and with a meter that reads
   nothing, interleaved rounds, median difference per block; and the meter alone. Target < 0.05 ms.

    .venv/bin/python benchmarks/bench_conditions.py [--rounds 20] [--runs 2] [--cells 5]

'Quiet' rounds are only as quiet as the machine: run it when nothing else runs (the verdict of
each quiet round is printed, with its reason, so a stray process shows).
"""
import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    """The options, read before the heavy imports below: a refused one costs none of them."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--cells", type=int, default=5)
    return ap.parse_args(argv)


if __name__ == "__main__":   # the options first (tests/project/test_bench_args.py)
    ARGS = parse_args()

import tunekit  # noqa: I001  (tunekit before torch: it quiets the deprecated pynvml shim's warning)
import torch  # noqa: F401

from tunekit.measure import conditions as mc
from tunekit.profiling import probe as probe_module

SPIN = "import time\nend = time.time() + 600\nwhile time.time() < end: pass"


class busy_cores:
    """Two spinning processes for the duration of a ``with`` block (they also stop by themselves)."""

    def __init__(self, n: int = 2):
        self.n = n

    def __enter__(self):
        self.procs = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(self.n)]
        time.sleep(0.3)  # let the scheduler spread them over the cores
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()
        return False


class _NoMeter:
    """A conditions meter that reads nothing: the 'off' side of the cost measurement."""

    def __init__(self, *a, **k):
        pass

    def start(self):
        return self

    def stop(self, *a, **k):
        return None


def detection(rounds: int, runs: int, cells: int) -> None:
    lab = tunekit.Lab(log_path=Path(tempfile.mkdtemp()) / "bench.jsonl")
    lab.run(steps=2, warmup=1, verbose=False)   # calibration, FLOP count and first-run costs out of the way
    t = lab.resolve()
    seen = {"quiet": [], "busy": []}
    print(f"1. detection: {rounds} rounds alternating quiet/busy; each {runs} Lab runs (3 timed steps) "
          f"and {cells} profiled training steps")
    for i in range(rounds):
        kind = "busy" if i % 2 else "quiet"
        ctx = busy_cores(2) if kind == "busy" else _Nothing()
        verdicts = []
        with ctx:
            for _ in range(runs):
                verdicts.append(("run", lab.run(steps=3, warmup=0, verbose=False).conditions))
            for _ in range(cells):
                with tunekit.profile(name="step", flops="never") as rec:
                    lab.train_step(t)
                verdicts.append(("cell", rec.conditions))
        seen[kind].extend(verdicts)
        flagged = sum(c.busy for _, c in verdicts)
        odd = next((c for _, c in verdicts if c.busy != (kind == "busy")), None)
        print(f"   round {i + 1:2d} {kind:<5}: {flagged}/{len(verdicts)} flagged busy"
              + (f"  (e.g. {odd})" if odd is not None else ""))
    for kind in ("busy", "quiet"):
        for what in ("run", "cell"):
            got = [c for w, c in seen[kind] if w == what]
            print(f"   {kind:<5} {what}s flagged busy: {sum(c.busy for c in got)}/{len(got)}")
    busy_rate = statistics.mean(c.busy for _, c in seen["busy"])
    quiet_rate = statistics.mean(c.busy for _, c in seen["quiet"])
    print(f"   busy flagged busy {busy_rate:.0%} (target >= 95%: {'PASS' if busy_rate >= 0.95 else 'FAIL'}); "
          f"quiet flagged busy {quiet_rate:.0%} (target <= 5%: {'PASS' if quiet_rate <= 0.05 else 'FAIL'})")


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def cost(rounds: int = 5, blocks: int = 3000) -> None:
    def per_block() -> float:
        t0 = time.perf_counter()
        for _ in range(blocks):
            with tunekit.profile(name="empty", flops="never"):
                pass
        return (time.perf_counter() - t0) / blocks

    real = probe_module.ConditionsMeter
    on, off = [], []
    per_block()  # warm
    for _ in range(rounds):
        probe_module.ConditionsMeter = _NoMeter
        off.append(per_block())
        probe_module.ConditionsMeter = real
        on.append(per_block())
        tunekit.clear_history()
    diffs = [a - b for a, b in zip(on, off)]
    n = 20000
    t0 = time.perf_counter()
    for _ in range(n):
        mc.ConditionsMeter().start().stop(0.001)
    alone = (time.perf_counter() - t0) / n
    d = statistics.median(diffs) * 1e3
    print(f"2. cost: an empty profiled block {statistics.median(off) * 1e3:.3f} ms without the conditions "
          f"meter, {statistics.median(on) * 1e3:.3f} ms with it: +{d:.4f} ms per block (median of "
          f"{rounds} interleaved rounds of {blocks}; rounds: {', '.join(f'{x * 1e3:+.4f}' for x in diffs)})")
    print(f"   the meter alone (start + stop + verdict): {alone * 1e3:.4f} ms; "
          f"target < 0.05 ms per cell: {'PASS' if d < 0.05 else 'FAIL'}")


def main(args: argparse.Namespace):
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {__import__('os').cpu_count()} CPUs")
    with tunekit.measure.watch_conditions() as w:
        cost()
    print(f"   machine during the cost rounds: {w.conditions}")
    detection(args.rounds, args.runs, args.cells)


if __name__ == "__main__":
    main(ARGS)
