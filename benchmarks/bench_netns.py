"""gloo all_reduce across two emulated nodes (a 50 Mbit/s, 1 ms link) against two ranks on one
node (its loopback), side by side in one run (issue 12, item 4). Needs root: see
tunekit.parallel.netns.check().

Each rank is a fresh interpreter started inside its node's namespace (``exec_prefix``), with
GLOO_SOCKET_IFNAME set to the node's interface; rank 0 hosts the rendezvous at its address.
Time per size: median over repeats of rank 0's all_reduce after a barrier. busbw follows the
nccl-tests convention (algbw x 2(n-1)/n; for 2 ranks busbw = algbw): with 2 ranks each rank
sends and receives the whole buffer once, so across the link the expected time is
size x 8 / rate (+ round trips).

    .venv/bin/python benchmarks/bench_netns.py [--mb 4] [--bandwidth 50mbit] [--latency 1ms]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

from tunekit.core.conditions import Conditions
from tunekit.core.formulas import algbw, allreduce_busbw
from tunekit.parallel.netns import EmulatedNodes, check

RANK = r"""
import json, sys, time
from datetime import timedelta
import torch, torch.distributed as dist
from tunekit.measure.conditions import ConditionsMeter
rank, world, addr, sizes, repeats = json.loads(sys.argv[1])
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://{addr}:29511", rank=rank, world_size=world,
                        timeout=timedelta(seconds=120))
out = {}
meter = ConditionsMeter().start()         # what else used the machine while this rank timed
for size in sizes:
    t = torch.ones(size // 4)
    times = []
    for i in range(repeats + 1):          # the first is a warm-up (connections, buffers)
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        times.append(time.perf_counter() - t0)
    out[size] = times[1:]
cond = meter.stop(threads=1)
dist.barrier()
dist.destroy_process_group()
if rank == 0:
    print(json.dumps({"times": out, "conditions": cond.to_dict()}))
"""


def allreduce_times(nodes: EmulatedNodes, placement, sizes, repeats=3, timeout_s=300) -> tuple[dict, Conditions]:
    """({size_bytes: [seconds]} of rank 0, the conditions over rank 0's timed loop); rank r runs
    on node ``placement[r]``."""
    env = dict(os.environ, GLOO_SOCKET_IFNAME=nodes.ifname)   # the ranks need torch only
    addr = nodes.addresses[placement[0]]
    procs = [subprocess.Popen(nodes.exec_prefix(node) + [sys.executable, "-c", RANK, json.dumps(
        [r, len(placement), addr, list(sizes), repeats])], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=env) for r, node in enumerate(placement)]
    try:
        outs = [p.communicate(timeout=timeout_s) for p in procs]
    finally:
        for p in procs:   # never leave a rank behind
            if p.poll() is None:
                p.kill()
                p.wait()
    bad = [f"rank {r}: {err.strip().splitlines()[-1] if err.strip() else p.returncode}"
           for r, (p, (_, err)) in enumerate(zip(procs, outs)) if p.returncode]
    if bad:
        raise RuntimeError("all_reduce failed: " + "; ".join(bad))
    got = json.loads(outs[0][0].strip().splitlines()[-1])
    return {int(k): v for k, v in got["times"].items()}, Conditions.from_dict(got["conditions"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, nargs="+", default=[1, 4])
    ap.add_argument("--bandwidth", default="50mbit")
    ap.add_argument("--latency", default="1ms")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    why = check()
    if why:   # not a failure of `make bench`: this machine cannot emulate nodes
        print(f"skipped: {why}")
        return
    sizes = [int(mb * 2**20) for mb in args.mb]
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs "
          "(a busy machine slows the loopback figures most)")
    with EmulatedNodes(2, args.bandwidth, args.latency) as nodes:
        rate = nodes.rate_bits
        rows = {"across the link (1 rank per node)": allreduce_times(nodes, [0, 1], sizes, args.repeats),
                "within node 0 (loopback)": allreduce_times(nodes, [0, 0], sizes, args.repeats)}
    print(f"gloo all_reduce, 2 ranks, fp32; link {args.bandwidth} one way latency {args.latency}")
    for where, (times, cond) in rows.items():
        print(f"  {where}: machine {cond}")
        for s in sizes:
            med = statistics.median(times[s])
            bus = allreduce_busbw(algbw(s, med), 2)
            print(f"  {where:36s} {s / 2**20:5.1f} MiB  {med * 1e3:9.1f} ms  busbw {8 * bus / 1e6:9.1f} Mbit/s"
                  f"  ({[round(t * 1e3, 1) for t in times[s]]} ms)")
    big, small = max(sizes), min(sizes)
    if big > small:
        across = rows["across the link (1 rank per node)"][0]
        slope = (big - small) * 8 / (statistics.median(across[big]) - statistics.median(across[small]))
        print(f"  marginal rate across the link: {slope / 1e6:.1f} Mbit/s (set: {rate / 1e6:.1f})")


if __name__ == "__main__":
    from tunekit.measure.conditions import watch

    with watch() as machine:  # what else used the machine meanwhile: a busy run is no measurement
        main()
    print(f"machine while this ran: {machine.conditions}")
