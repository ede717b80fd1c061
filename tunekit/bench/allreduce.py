"""All-reduce bus bandwidth with torch.distributed: gloo across CPU processes, NCCL across GPUs.

Processes are spawned on this machine only and rendezvous on 127.0.0.1 through a TCPStore that
this process hosts on a port the kernel picks (bound once, so no other program can take it in
between); sizes are bounded, the whole run has a deadline, and every process is joined or killed
before returning. Their output goes to temporary files, never to pipes that could fill.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

import torch

from ..core.formulas import algbw, allreduce_busbw
from ..measure.timing import stats
from ._frame import frame

MAX_BYTES = 256 * 2**20   # a bound on the buffer size per rank


def _worker(rank, world, port, sizes, warmup, repeats, backend, timeout_s) -> dict:
    """One rank: init on 127.0.0.1, time all_reduce per size, return {size: [seconds]}."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dev = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    # the parent hosts the store: the port is already bound, no bind race
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False,
                          timeout=timedelta(seconds=timeout_s))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    try:
        results = {}
        for size in sizes:
            t = torch.ones(max(1, size // 4), dtype=torch.float32, device=dev)
            times = []
            for i in range(warmup + repeats):
                dist.barrier()
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
                t0 = time.perf_counter()
                dist.all_reduce(t)
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
                if i >= warmup:
                    times.append(time.perf_counter() - t0)
            results[size] = times
        dist.barrier()
        return results
    finally:
        dist.destroy_process_group()


def _launch(world, port, sizes, warmup, repeats, backend, timeout_s, files):
    """Start `world` fresh interpreters running this module (no dependence on the caller's
    __main__, so it works from scripts, notebooks and pytest alike); rank r writes to files[r]."""
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", NCCL_SOCKET_IFNAME="lo",
               MASTER_ADDR="127.0.0.1", PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    arg = json.dumps(dict(world=world, port=port, sizes=sizes, warmup=warmup, repeats=repeats,
                          backend=backend, timeout_s=timeout_s))
    return [subprocess.Popen([sys.executable, "-m", "tunekit.bench._rank", str(r), arg],
                             stdout=files[r][0], stderr=files[r][1], env=env)
            for r in range(world)]


def _read(f) -> str:
    f.seek(0)
    return f.read().decode(errors="replace")


def all_reduce_busbw(world_size: int = 2, sizes_bytes=(2**12, 2**16, 2**20), backend=None,
                     warmup: int = 2, repeats: int = 5, timeout_s: float = 60.0):
    """algbw and busbw (nccl-tests convention: busbw = algbw * 2(n-1)/n) per buffer size.

    backend: None picks nccl when there are `world_size` GPUs, else gloo on CPU processes.
    Time per size is the median over repeats of rank 0's all_reduce (after a barrier), with the
    device synchronized. Bandwidths are in GB/s (1e9 bytes); `busbw_gbit_per_s` is x8 (network
    links are quoted in Gbit/s).
    """
    sizes = [int(s) for s in sizes_bytes]
    if any(s <= 0 or s > MAX_BYTES for s in sizes):
        raise ValueError(f"sizes must be in 1..{MAX_BYTES} bytes")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world_size else "gloo"
    import torch.distributed as dist

    # the rendezvous store lives here, on a kernel-chosen port of 127.0.0.1 held for the run
    store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=timeout_s))
    files = [(tempfile.TemporaryFile(), tempfile.TemporaryFile()) for _ in range(world_size)]
    procs = []
    deadline = time.monotonic() + timeout_s + 60   # + time to start interpreters and torch
    status, payload, notes = "error", "", []
    try:
        procs = _launch(world_size, store.port, sizes, warmup, repeats, backend, timeout_s, files)
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        outs = [(p.returncode, _read(o), _read(e)) for p, (o, e) in zip(procs, files)]
        if all(rc == 0 for rc, _, _ in outs):
            last = outs[0][1].strip().splitlines()[-1]
            status, payload = "ok", {int(k): v for k, v in json.loads(last)["times"].items()}
        else:
            payload = "; ".join(f"rank {r} exit {rc}: {err.strip().splitlines()[-1] if err.strip() else ''}"
                                for r, (rc, _, err) in enumerate(outs) if rc)
    except subprocess.TimeoutExpired:
        payload = f"no result within {timeout_s + 60:.0f} s"
    except (ValueError, IndexError, KeyError) as e:   # rank 0 printed no result line
        payload = f"unreadable result ({type(e).__name__}: {e})"
    finally:
        for p in procs:   # never leave a rank behind
            if p.poll() is None:
                p.kill()
                p.wait()
        for pair in files:
            for f in pair:
                f.close()
        del store
    rows = []
    if status != "ok":
        notes.append(f"all-reduce failed: {payload}")
        for s in sizes:
            rows.append({"size_bytes": s, **stats([]), "algbw_gb_per_s": math.nan,
                         "busbw_gb_per_s": math.nan, "busbw_gbit_per_s": math.nan})
    else:
        for s in sizes:
            st = stats(payload[s])
            a = algbw(s, st["median_s"])
            b = allreduce_busbw(a, world_size)
            rows.append({"size_bytes": s, **st, "algbw_gb_per_s": a / 1e9,
                         "busbw_gb_per_s": b / 1e9, "busbw_gbit_per_s": 8 * b / 1e9})
    df = frame(rows, "all_reduce", f"{backend} x{world_size}", notes)
    df.attrs.update(backend=backend, world_size=world_size)
    return df

