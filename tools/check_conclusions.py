"""Run a chapter several times and count how often each printed conclusion comes out the same.

    python tools/check_conclusions.py notebooks/13_case_study.ipynb --runs 10 [--min 0.9]

A chapter's printed lines are its conclusions. Numbers change from run to run and are masked
(`2.13x` and `1.97x` read the same), words are not: "helped" in one run and "within noise" in the
next is a flip. For each line position the most common text is found and counted; the check
passes when every line agrees in at least `--min` of the runs (the issue's 9 of 10). Exit 1
otherwise, listing the lines that flipped and their variants. Run it on a quiet machine.
"""
import argparse
import collections
import re
import sys
import time

import nbformat
from nbclient import NotebookClient

NUMBER = re.compile(r"[-+]?\d[\d,]*(\.\d+)?(e[-+]?\d+)?")


def conclusions(nb) -> list[str]:
    """Every stdout line of the executed notebook, numbers masked, in order."""
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream" and o.get("name") == "stdout":
                out += [NUMBER.sub("#", line).strip() for line in o["text"].splitlines() if line.strip()]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebook")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--min", type=float, default=0.9, help="agreement needed per line (default 0.9)")
    ap.add_argument("--timeout", type=int, default=600)
    args = ap.parse_args(argv)
    if args.runs < 2 or not 0 < args.min <= 1:
        ap.error("--runs must be >= 2 and --min in (0, 1]")
    runs = []
    for i in range(args.runs):
        nb = nbformat.read(args.notebook, as_version=4)
        t0 = time.perf_counter()
        NotebookClient(nb, timeout=args.timeout, kernel_name="python3").execute()
        runs.append(conclusions(nb))
        print(f"run {i + 1}/{args.runs}: {len(runs[-1])} lines, {time.perf_counter() - t0:.0f} s", flush=True)
    worst, failed = 1.0, []
    for pos in range(max(map(len, runs))):
        texts = collections.Counter(r[pos] if pos < len(r) else "<missing>" for r in runs)
        text, n = texts.most_common(1)[0]
        share = n / len(runs)
        worst = min(worst, share)
        if share < args.min:
            failed.append((pos, share, texts))
    print(f"\n{args.notebook}: {len(runs)} runs, {max(map(len, runs))} lines; "
          f"worst agreement {worst:.0%} (needed {args.min:.0%})")
    for pos, share, texts in failed:
        print(f"\nline {pos + 1} agrees in {share:.0%}:")
        for text, n in texts.most_common():
            print(f"  {n:2d}x  {text}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
