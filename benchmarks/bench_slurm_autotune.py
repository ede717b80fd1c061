"""An 8-trial autotune on the test Slurm cluster against the same sweep in the Lab (issue 41 item 6,
part 2 of bench_slurm): wall time each, and whether both name the same winner or both say
INCONCLUSIVE, printed side by side.

The sweep: the demo GPT (preset cpu-tiny, seq_len 32) from micro-batch 2, candidates micro-batch
1, 2, 4, 8 (the other stages fixed), ``repeats=2`` (every candidate measured twice before anyone is
judged), 3 timed steps a trial. Both sides stop after 8 trial slots (`Capped`: past them the budget
is spent, so the settle, final and tiebreak races end as a spent budget ends them), so both run
the same 8 trials: 4 candidates x 2 rounds. The cluster side is ``lab.autotune(on=Slurm(...))``:
each trial a job (``max_jobs`` queued at once) on the one-node test cluster (tools/slurm_cluster.py,
started here as root); ``exclusive=True`` so one job runs at a time on its node.

    .venv/bin/python benchmarks/bench_slurm_autotune.py [--max-jobs 4] [--trials 8]   # ~4-6 min, as root
"""
import argparse
import os
import sys
import tempfile
import time
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    """The options, read before the heavy imports below: a refused one costs none of them."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--max-jobs", type=int, default=4)
    return ap.parse_args(argv)


if __name__ == "__main__":   # the options first (tests/project/test_bench_args.py)
    ARGS = parse_args()

import tunekit  # noqa: F401, I001  (tunekit before torch: it quiets the deprecated pynvml shim's warning)

from tunekit.autotune import LabTrials
from tunekit.lab.cluster import ClusterTrials
from tunekit.lab.lab import Lab
from tunekit.parallel.slurm import Slurm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import slurm_cluster  # noqa: E402

SPACE = {"precision": ["fp32"], "attention": ["sdpa"], "optimizer": ["adamw"], "checkpointing": [False],
         "compile": [False], "micro_batch": [1, 2, 4, 8]}


class Capped:
    """A trials object that allows ``n`` trials: once they have started, its clock is past any
    budget, so the search's next budget check stops it. Everything else is the inner object's."""

    def __init__(self, inner, n: int):
        self.inner, self.n, self.started = inner, n, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def clock(self) -> float:
        return self.inner.clock() + (1e9 if self.started >= self.n else 0.0)

    def measure(self, t, steps):
        self.started += 1
        return self.inner.measure(t, steps)

    def many(self, trials):
        self.started += len(trials)
        return self.inner.measure_many(trials)


def capped(inner, n):
    out = Capped(inner, n)
    if hasattr(inner, "measure_many"):
        out.measure_many = out.many   # the search runs a round's trials at once only where the inner does
    return out


def lab_for(folder: Path) -> Lab:
    lab = Lab(preset="cpu-tiny", device="cpu", log_path=folder / "runs.jsonl")
    lab.defaults = lab.resolve(micro_batch=2, seq_len=32)
    return lab


def sweep(lab, trials, on=None):
    t0 = time.perf_counter()
    found = lab.autotune(budget_s=3600, steps=3, warmup=1, repeats=2, max_micro_batch=8, space=SPACE,
                         trials=trials, on=on, verbose=False)
    return found, time.perf_counter() - t0


def said(found) -> str:
    if found.toggles is None:
        return "nothing measured"
    return ("INCONCLUSIVE: " if found.inconclusive else "winner: ") + f"micro_batch={found.toggles.micro_batch}"


def main(args: argparse.Namespace):
    if slurm_cluster.missing() is not None:
        sys.exit(f"no test cluster here: {slurm_cluster.missing()}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        lab = lab_for(tmp / "local")
        (tmp / "local").mkdir()
        local, local_s = sweep(lab, capped(LabTrials(lab, 1, None, 3600), args.trials))
        with slurm_cluster.cluster(tmp / "slurm", cpus=4) as env:
            os.environ.update(env)
            (tmp / "cluster").mkdir()
            clab = lab_for(tmp / "cluster")
            target = Slurm(time="10", max_jobs=args.max_jobs, folder=str(tmp / "jobs"))
            inner = ClusterTrials(clab, target, 1, None, 3600)
            remote, remote_s = sweep(clab, capped(inner, args.trials), on=target)
            spans = sorted(inner.spans, key=lambda s: s[1])
            most = max(sum(1 for _, a, b in spans if a <= t < b) for _, t, _ in spans) if spans else 0
    rows = [("", "Lab (local)", f"cluster (max_jobs={args.max_jobs})"),
            ("wall time", f"{local_s:.1f} s", f"{remote_s:.1f} s"),
            ("trials", str(sum(len(c.runs) for c in local.candidates)),
             str(sum(len(c.runs) for c in remote.candidates))),
            ("per trial", f"{local_s / max(1, sum(len(c.runs) for c in local.candidates)):.1f} s",
             f"{remote_s / max(1, len(inner.jobs)):.1f} s (jobs: {len(inner.jobs)}, at most {most} queued at once)"),
            ("status", local.status, remote.status),
            ("says", said(local), said(remote))]
    w0, w1 = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
    print(f"8-trial autotune, cpu-tiny seq_len 32, micro-batch 1/2/4/8 x 2 repeats; load {os.getloadavg()[0]:.2f}"
          f" on {os.cpu_count()} cores")
    for a, b, c in rows:
        print(f"{a:<{w0}}  {b:<{w1}}  {c}")
    same = (local.inconclusive and remote.inconclusive) or (
        not local.inconclusive and not remote.inconclusive and local.toggles == remote.toggles)
    print("same outcome:", "yes" if same else "no")
    print("\nLab:     ", local.verdict.splitlines()[0][:300])
    print("cluster: ", remote.verdict.splitlines()[0][:300])


if __name__ == "__main__":
    main(ARGS)
