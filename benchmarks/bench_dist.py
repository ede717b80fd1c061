"""The distributed engine's own costs on CPU ranks (gloo, 2 ranks, the cpu-tiny GPT):

1. launch to first step: ``tunekit.parallel.launch`` from the call to rank 0's first training step
   (interpreters started by the elastic agent, torch imported, rendezvous, process group, model
   built and wrapped, one FLOP count), for DDP and FSDP;
2. collective accounting on vs off (target < 2% of a step), side by side in one run:
   a. what the accounting costs a timed step of a run: launches with comm on and off alternate
      (on, off, off, on, ...) and their step times (median over the timed steps) are compared;
      tunekit counts on the last untimed warm-up step, so the timed steps run without it;
   b. what the counter costs the one step it watches: inside one job every rank alternates
      steps with and without it (the slowest rank's time per step, medians); plus the direct
      figure, ops its dispatch mode sees per step x its cost per op, over the step time.

    .venv/bin/python benchmarks/bench_dist.py [--pairs 30] [--micro-batch 8]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    """The options, read before the heavy imports below: a refused one costs none of them."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank")
    ap.add_argument("--pairs", type=int, default=30)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--skip-launch", action="store_true")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--launches", type=int, default=2)
    return ap.parse_args(argv)


if __name__ == "__main__":   # the options first (tests/project/test_bench_args.py)
    ARGS = parse_args()

import torch

MODEL = {"kind": "gpt", "config": {"n_layer": 2, "n_head": 4, "n_embd": 128, "block_size": 128}}


def load() -> str:
    la = os.getloadavg()[0]
    return f"load average {la:.2f} on {os.cpu_count()} cores" + (" (machine busy)" if la > 1.0 else "")


def rank_main(spec_path: str) -> None:
    """One rank of part 2 (run under the elastic agent)."""
    import torch.distributed as dist

    from tunekit.measure.comm import CommCounter
    from tunekit.measure.timing import time_repeats
    from tunekit.parallel.worker import Rank

    spec = json.loads(Path(spec_path).read_text())
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    trainer = Rank(spec, rank, world, world, torch.device("cpu"))
    counter = CommCounter()
    for _ in range(3):
        trainer.step()
    on, off = [], []
    for i in range(spec["pairs"]):
        for use in ((True, False) if i % 2 == 0 else (False, True)):
            dist.barrier()
            if use:
                with counter:
                    on += time_repeats(trainer.step, warmup=0, repeats=1)
            else:
                off += time_repeats(trainer.step, warmup=0, repeats=1)
    seen = _ops_per_step(trainer)
    per_op = _cost_per_op()
    rows = [None] * world
    dist.all_gather_object(rows, {"on": on, "off": off})
    if rank == 0:
        on_s = [max(r["on"][i] for r in rows) for i in range(len(on))]
        off_s = [max(r["off"][i] for r in rows) for i in range(len(off))]
        out = {"on": statistics.median(on_s), "off": statistics.median(off_s), "ops": seen,
               "on_min": min(on_s), "off_min": min(off_s),
               "per_op_s": per_op, "c10d": sum(v["count"] for v in counter.table().values())}
        Path(spec["out"]).write_text(json.dumps(out))
    dist.destroy_process_group()


def _ops_per_step(trainer) -> int:
    from tunekit.measure.torch_private import dispatch_mode_class

    class Count(dispatch_mode_class()):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        trainer.step()
    return Count.n


def _cost_per_op(n: int = 20000) -> float:
    """Seconds the counter adds to one (non-collective) op: a tiny add with and without it."""
    from tunekit.measure.comm import CommCounter

    a = torch.ones(1)

    def loop():
        t0 = time.perf_counter()
        for _ in range(n):
            torch.add(a, a)
        return time.perf_counter() - t0

    bare = min(loop() for _ in range(3))
    with CommCounter():
        counted = min(loop() for _ in range(3))
    return (counted - bare) / n


def accounting(parallel: str, pairs: int, micro_batch: int) -> dict:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    work = Path(tempfile.mkdtemp(prefix="bench-dist-"))
    spec = {"model": MODEL, "parallel": parallel, "toggles": {"micro_batch": micro_batch},
            "pairs": pairs, "count_flops": False, "out": str(work / "out.json")}
    (work / "spec.json").write_text(json.dumps(spec))
    cfg = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, rdzv_backend="c10d",
                       rdzv_endpoint="127.0.0.1:0", max_restarts=0, run_id=uuid.uuid4().hex[:8],
                       logs_specs=DefaultLogsSpecs(log_dir=str(work / "logs"), redirects=Std.ALL))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) if p else os.getcwd() for p in sys.path)
    elastic_launch(cfg, sys.executable)(os.path.abspath(__file__), "--rank", str(work / "spec.json"))
    return json.loads((work / "out.json").read_text())


def main(args: argparse.Namespace):
    if args.rank:
        return rank_main(args.rank)
    from tunekit.parallel.launch import launch

    print(f"torch {torch.__version__}; {load()}")
    print("1. launch to first step (2 CPU ranks, cpu-tiny GPT, micro_batch 8 x 128 tokens)")
    for parallel in ("ddp", "fsdp") if not args.skip_launch else ():
        for i in range(args.launches):
            t0 = time.perf_counter()
            r = launch({"model": MODEL, "parallel": parallel, "steps": 3, "warmup": 1,
                        "toggles": {"micro_batch": args.micro_batch}, "peak_tflops": 1.0}, nproc=2)
            print(f"   {parallel:5s} #{i + 1}: launch_s {r.launch_s:5.2f} s to the first step; whole "
                  f"call {time.perf_counter() - t0:5.2f} s (step {r.step_s * 1e3:.0f} ms)")
            print("      " + next(n for n in r.notes if n.startswith("launch to first step")))
    print(f"2a. accounting on vs off over whole runs ({args.runs} pairs of launches, {args.steps} timed "
          f"steps each); {load()}")
    for parallel in ("ddp", "fsdp") if args.runs else ():
        times, fastest = {True: [], False: []}, {True: [], False: []}
        for i in range(args.runs):
            for comm in ((True, False) if i % 2 == 0 else (False, True)):
                r = launch({"model": MODEL, "parallel": parallel, "steps": args.steps, "warmup": 3,
                            "comm": comm, "toggles": {"micro_batch": args.micro_batch},
                            "peak_tflops": 1.0}, nproc=2)
                times[comm].append(r.step_s)
                fastest[comm].append(r.step_s_min)
        on, off = statistics.median(times[True]), statistics.median(times[False])
        quick = statistics.median(fastest[True]) / statistics.median(fastest[False])
        print(f"   {parallel:5s}: step {off * 1e3:6.1f} ms off, {on * 1e3:6.1f} ms on -> ratio {on / off:.3f} "
              f"(fastest steps: {quick:.3f})")
    print(f"2b. the counted step itself, {args.pairs} pairs of steps per sharding; {load()}")
    for parallel in ("ddp", "fsdp") if args.pairs else ():
        o = accounting(parallel, args.pairs, args.micro_batch)
        direct = o["ops"] * o["per_op_s"] / o["off"]
        print(f"   {parallel:5s}: step {o['off'] * 1e3:6.1f} ms off, {o['on'] * 1e3:6.1f} ms on -> ratio "
              f"{o['on'] / o['off']:.3f} (fastest steps: {o['on_min'] / o['off_min']:.3f}); direct: "
              f"{o['ops']} ops/step x {o['per_op_s'] * 1e6:.2f} us = {direct:.2%} of a step")
    print(f"   ({load()} at the end)")


if __name__ == "__main__":
    from tunekit.measure.conditions import watch

    with watch() as machine:  # what else used the machine meanwhile: a busy run is no measurement
        main(ARGS)
    print(f"machine while this ran: {machine.conditions}")
