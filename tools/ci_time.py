"""Where CI's unit-test time goes: `make test`'s share (not marked slow) and `make test-slow`'s.

    python -m pytest -q -m "not gpu" --durations=0 -p no:cacheprovider tests > build/durations.log
    python tools/ci_time.py build/durations.log [--top 15]

Reads the per-test durations pytest printed (setup + call + teardown, summed per test), asks pytest
which tests are marked slow (a --collect-only run), and prints the sum of each share, the longest
tests `make test` keeps and every slow test with its time. Run it at a quiet moment: the figures
are of the machine as it was while the durations were taken.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^\s*([\d.]+)s (setup|call|teardown)\s+(\S+)")


def durations(text: str) -> dict[str, float]:
    """Seconds per test id, its setup, call and teardown summed."""
    out: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            out[m.group(3)] += float(m.group(1))
    return dict(out)


def slow_ids() -> set[str]:
    """The ids of the tests marked slow (and not gpu), as pytest collects them here."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "slow and not gpu",
                           "-p", "no:cacheprovider", "tests"], cwd=ROOT, capture_output=True, text=True)
    return {line.strip() for line in done.stdout.splitlines() if "::" in line}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", type=Path, help="pytest output with --durations=0")
    ap.add_argument("--top", type=int, default=15, help="how many of make test's longest tests to list")
    args = ap.parse_args(argv)
    times, slow = durations(args.log.read_text()), slow_ids()
    fast = {k: v for k, v in times.items() if k not in slow}
    moved = {k: times.get(k, 0.0) for k in slow}
    print(f"all tests timed: {sum(times.values()):.0f} s over {len(times)} tests")
    print(f"make test (not slow): {sum(fast.values()):.0f} s; make test-slow: {sum(moved.values()):.0f} s "
          f"over {len(slow)} tests ({sum(k not in times for k in slow)} not in the log)")
    print(f"\nthe {args.top} longest tests make test keeps:")
    for k, v in sorted(fast.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"  {v:7.1f} s  {k}")
    print("\nthe tests marked slow:")
    for k, v in sorted(moved.items(), key=lambda kv: -kv[1]):
        print(f"  {v:7.1f} s  {k}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
