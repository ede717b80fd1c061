"""The CPU peak of a run, repeatable, and lab.expect's peak against it (issue 42, peak memory).

A run's CPU peak is the process's RSS high-water mark over its timed steps, from a settled start:
glibc hands its heaps' freed pages back (malloc_trim) before the meter reads its start
(measure.device_meter.DeviceMeter). This script measures, on the built-in GPT (cpu-tiny, the setting
bench_expect.py --quick judges from):

1. the ladder: from one traced base run, lab.expect's peak of each setting, then the run of it
   (made after its expectation), expected against measured (goal: within 5%);
2. the same setting measured again and again after other settings: the spread of its peak (goal:
   within 1-2%); also each run's start (RSS settled) and what its steps added above it.

``--bare`` measures with the meter's start unsettled (the meter before issue 42), for comparison:
there the peak holds whatever earlier runs left in glibc's heaps.

    .venv/bin/python benchmarks/bench_cpu_peak.py            # ~3 min on a quiet 2-core CPU
    .venv/bin/python benchmarks/bench_cpu_peak.py --bare     # the unsettled meter, same runs
"""
import argparse
import os
import statistics
import warnings

import tunekit
from tunekit.measure import device_meter

warnings.filterwarnings("ignore")
MiB = 2**20
GOAL_PEAK, GOAL_REPEAT = 0.05, 0.02
STEPS, WARMUP = 5, 2
LADDER = [("ckpt on", {"checkpointing": True}), ("mb x2", {"micro_batch": 16}), ("mb /2", {"micro_batch": 4}),
          ("sgd", {"optimizer": "sgd"}), ("accum x2", {"grad_accum": 2}),
          ("ckpt on + mb x2", {"checkpointing": True, "micro_batch": 16}),
          ("ckpt on + sgd", {"checkpointing": True, "optimizer": "sgd"})]
# the base setting again after each of these
AGAIN_AFTER = [("mb x2", {"micro_batch": 16}), ("ckpt on", {"checkpointing": True}), ("sgd", {"optimizer": "sgd"})]


def row(label, r, e=None):
    start = r.peak_mem_start_bytes
    above = (r.peak_mem_bytes - start) / MiB if start is not None else float("nan")
    exp = f"{e.peak_bytes / MiB:>9.1f}{e.peak_bytes / r.peak_mem_bytes - 1:>+9.1%}" if e is not None else " " * 18
    verdict = r.conditions.verdict if r.conditions else "?"
    print(f"{label:<20}{r.peak_mem_bytes / MiB:>10.1f}{exp}{(start or 0) / MiB:>10.1f}{above:>9.1f}  {verdict}",
          flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    """The command line (``argv``, else sys.argv's): an unknown option is refused before any work."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bare", action="store_true", help="the meter's start unsettled (the meter before issue 42)")
    return ap.parse_args(argv)


def main(bare: bool = False):
    if bare:   # the meter before issue 42: no malloc_trim before its start
        init = device_meter.DeviceMeter.__init__
        device_meter.DeviceMeter.__init__ = lambda self, device, cuda_index=None, settle=True: init(
            self, device, cuda_index, settle=False)
    print(f"machine at start: load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
          f"meter start {'unsettled (--bare)' if bare else 'settled (malloc_trim)'}")
    lab = tunekit.Lab(micro_batch=8, seq_len=128, log_path="/tmp/bench_cpu_peak.jsonl")
    base = lab.run(steps=STEPS, warmup=WARMUP, trace=True, verbose=False)
    print(f"{'setting':<20}{'meas MiB':>10}{'exp MiB':>9}{'error':>9}{'start':>10}{'added':>9}  machine")
    row("base (traced)", base)
    errors = []
    for label, changes in LADDER:
        e = lab.expect(base=base, **changes)
        r = lab.run(steps=STEPS, warmup=WARMUP, verbose=False, **changes)
        row(label, r, e)
        errors.append(abs(e.peak_bytes / r.peak_mem_bytes - 1))
    again = []
    for label, changes in AGAIN_AFTER:
        row(label, lab.run(steps=STEPS, warmup=WARMUP, verbose=False, **changes))
        r = lab.run(steps=STEPS, warmup=WARMUP, verbose=False)
        row(f"base, after {label}", r)
        again.append(r.peak_mem_bytes)
    spread = max(again) / min(again) - 1
    print(f"\nexpected vs measured peak |error|: median {statistics.median(errors):.1%}, worst {max(errors):.1%} "
          f"(goal <= {GOAL_PEAK:.0%}); {'met' if max(errors) <= GOAL_PEAK else 'NOT met'}")
    print(f"the base setting measured {len(again)} times after other settings: "
          f"{', '.join(f'{p / MiB:.1f}' for p in again)} MiB, spread {spread:.1%} (goal <= {GOAL_REPEAT:.0%}); "
          f"the traced base first: {base.peak_mem_bytes / MiB:.1f} MiB")
    print(f"machine at end: load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main(parse_args().bare)
