"""What the scheduler costs a run (issue 41, item 6).

Part 1 (this file): submit to first step on the test cluster against a local launch of the same
run. One spec (the cpu-tiny GPT, DDP over 2 gloo ranks, a few steps) is run both ways, alternating
(local, cluster, cluster, local, ...):

- local: ``tunekit.parallel.launch.launch(spec, nproc=2)``; its ``RunResult.launch_s`` is the call
  to rank 0's first training step (the elastic agent, two interpreters importing torch, the
  rendezvous, the model built and wrapped, one FLOP count);
- cluster: ``Slurm(ntasks_per_node=2).submit(spec, folder).wait()`` on a one-node Slurm started
  here by tools/slurm_cluster.py (or the one SLURM_CONF names, with --use-env); its ``launch_s`` is
  sbatch to rank 0's first training step: the same as local plus the queue, the scheduler's
  allocation, the batch script and srun. The submit-to-RUNNING part is also shown (seen by polling
  scontrol every 0.5 s: +-0.5 s).

Both are printed side by side in one run (median and best of the repeats: load only ever slows a
launch, so the best is the machine's figure and the median what a busy day sees), with the ratio
and the machine's conditions (load average, cores, each run's conditions verdict).

Part 2, the 8-trial autotune on the cluster against the same sweep in the Lab, is not here yet:
`autotune_on_cluster` is its stub.

    .venv/bin/python benchmarks/bench_slurm.py [--repeats 2] [--steps 3] [--use-env]
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))


def load() -> str:
    la = os.getloadavg()[0]
    return f"load average {la:.2f} on {os.cpu_count()} cores" + (" (machine busy)" if la > 1.0 else "")


def the_spec(steps: int) -> dict:
    from tunekit.models.gpt import GPT, GPTConfig
    from tunekit.models.spec import model_spec

    return {"model": model_spec(GPT(GPTConfig.preset("cpu-tiny"))), "parallel": "ddp", "steps": steps,
            "warmup": 1, "seed": 0, "toggles": {"micro_batch": 2, "seq_len": 32}, "peak_tflops": 1.0,
            "comm": False}


def local(spec: dict) -> dict:
    from tunekit.parallel.launch import launch

    t0 = time.monotonic()
    r = launch(spec, nproc=2)
    return {"launch_s": r.launch_s, "wall_s": time.monotonic() - t0, "step_s": r.step_s,
            "conditions": getattr(r.conditions, "verdict", "?")}


def on_cluster(spec: dict, folder: Path) -> dict:
    from tunekit.parallel.slurm import Slurm

    t0 = time.monotonic()
    running = []

    def state(s, info):
        if s == "RUNNING" and not running:
            running.append(time.monotonic() - t0)
    r = Slurm(ntasks_per_node=2, time="5").submit(spec, folder).wait(on_state=state)
    return {"launch_s": r.launch_s, "wall_s": time.monotonic() - t0, "step_s": r.step_s,
            "to_running_s": running[0] if running else float("nan"),
            "conditions": getattr(r.conditions, "verdict", "?"), "job": r.job["id"], "state": r.job["state"]}


def autotune_on_cluster(*args, **kwargs):
    """Part 2 (another change): an 8-trial ``lab.autotune(..., on=Slurm(...))`` against the same sweep
    in the Lab: wall time, and the same winner or INCONCLUSIVE said the same way."""
    raise NotImplementedError("bench_slurm part 2 (8-trial autotune on the cluster) is not written yet")


def _row(name: str, runs: list[dict], key: str) -> str:
    xs = [r[key] for r in runs]
    each = ", ".join(f"{x:.2f}" for x in xs)
    return f"  {name:<34} median {statistics.median(xs):6.2f} s   best {min(xs):6.2f} s   ({each})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2, help="launches each way (alternating)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per run")
    ap.add_argument("--use-env", action="store_true", help="submit to the cluster SLURM_CONF names "
                    "instead of starting a test cluster")
    args = ap.parse_args(argv)
    import slurm_cluster
    import torch

    spec = the_spec(args.steps)
    work = Path(tempfile.mkdtemp(prefix="bench-slurm-"))
    print(f"bench_slurm part 1: DDP over 2 gloo ranks, cpu-tiny GPT, micro-batch 2 x 32 tokens, "
          f"{args.steps} timed steps; torch {torch.__version__}; {load()} at the start")
    if args.use_env:
        if "SLURM_CONF" not in os.environ:
            print("--use-env: SLURM_CONF is not set")
            return 2
        cm = None
    else:
        why = slurm_cluster.missing()
        if why:
            print(f"no test cluster here: {why}")
            return 2
        cm = slurm_cluster.cluster(work / "slurm", cpus=4)
        os.environ.update(cm.__enter__())
    try:
        loc, clu = [], []
        for i in range(args.repeats):
            for way in (("local", "cluster") if i % 2 == 0 else ("cluster", "local")):
                if way == "local":
                    loc.append(local(spec))
                else:
                    clu.append(on_cluster(spec, work / f"job-{i}"))
                last = (loc if way == "local" else clu)[-1]
                print(f"  {way:<8} run {i + 1}: launch to first step {last['launch_s']:.2f} s; {load()}", flush=True)
    finally:
        if cm is not None:
            cm.__exit__(None, None, None)
    print("\nlaunch to first step, side by side:")
    print(_row("local (tunekit.parallel.launch)", loc, "launch_s"))
    print(_row("cluster (sbatch -> first step)", clu, "launch_s"))
    print(_row("  of which sbatch -> RUNNING", clu, "to_running_s"))
    med = statistics.median(c["launch_s"] for c in clu) / statistics.median(x["launch_s"] for x in loc)
    best = min(c["launch_s"] for c in clu) / min(x["launch_s"] for x in loc)
    extra = statistics.median(c["launch_s"] for c in clu) - statistics.median(x["launch_s"] for x in loc)
    print(f"  ratio cluster / local: {med:.2f}x (medians), {best:.2f}x (best); the scheduler adds "
          f"{extra:+.2f} s (medians)")
    print(f"  step time: local {statistics.median(x['step_s'] for x in loc) * 1e3:.1f} ms, cluster "
          f"{statistics.median(c['step_s'] for c in clu) * 1e3:.1f} ms (medians of the runs' means)")
    print(f"conditions: runs' verdicts local {[x['conditions'] for x in loc]}, cluster "
          f"{[c['conditions'] for c in clu]}; jobs {[c['job'] + ' ' + c['state'] for c in clu]}; {load()} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
