"""All-reduce bus bandwidth with torch.distributed: gloo across CPU processes, NCCL across GPUs.

The ranks are started the way a distributed Lab run starts them (tunekit.parallel.launch): by
torch.distributed's elastic agent, the launcher torchrun runs, each rank a fresh interpreter
(``python -m tunekit.bench.rank``) that rendezvouses on 127.0.0.1 through the agent's c10d store
on a port the kernel picks (tunekit.parallel.elastic.run_ranks). Sizes are bounded; rendezvous
and every collective have the deadline ``timeout_s``; the agent stops every rank when one fails;
the ranks' output goes to log files in a temporary folder.
"""
from __future__ import annotations

import json
import math
import shutil
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch

from tunekit.bench.frame import frame
from tunekit.core.formulas import algbw, allreduce_busbw
from tunekit.measure.timing import stats
from tunekit.parallel.elastic import run_ranks

MAX_BYTES = 256 * 2**20   # a bound on the buffer size per rank


class _RankFailed(RuntimeError):
    """A rank exited with an error; the message names each failed rank."""


def time_all_reduce(rank, world, sizes, warmup, repeats, backend, timeout_s) -> dict:
    """Run as one rank under the agent (MASTER_ADDR/PORT in its environment): time all_reduce
    per buffer size, return {size: [seconds]}."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dev = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world,
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


def _launch(world: int, cfg: dict, work: Path) -> None:
    """Run ``world`` ranks of ``python -m tunekit.bench.rank CFG`` under the elastic agent and
    wait for them; a failed rank raises _RankFailed with its exit code and last stderr line."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    try:
        run_ranks(world, "tunekit.bench.rank", [json.dumps(cfg)], work, "allreduce",
                  env={"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}, join_timeout=cfg["timeout_s"])
    except ChildFailedError as e:
        raise _RankFailed("; ".join(f"rank {r} exit {f.exitcode}: {_last_line(work, f.local_rank)}"
                                     for r, f in sorted(e.failures.items()))) from None


def _last_line(work: Path, local_rank: int) -> str:
    logs = sorted((work / "logs").rglob(f"{local_rank}/stderr.log"))
    lines = logs[-1].read_text(errors="replace").strip().splitlines() if logs else []
    return lines[-1] if lines else "(no stderr)"


def all_reduce_busbw(world_size: int = 2, sizes_bytes=(2**12, 2**16, 2**20), backend=None,
                     warmup: int = 2, repeats: int = 5, timeout_s: float = 60.0):
    """algbw and busbw (nccl-tests convention: busbw = algbw * 2(n-1)/n) per buffer size.

    backend: None picks nccl when there are `world_size` GPUs, else gloo on CPU processes.
    Time per size is the median over repeats of rank 0's all_reduce (after a barrier), with the
    device synchronized. Bandwidths are in GB/s (1e9 bytes); `busbw_gbit_per_s` is x8 (network
    links are quoted in Gbit/s).

    Example: ``bench.all_reduce_busbw(world_size=2)``.
    """
    sizes = [int(s) for s in sizes_bytes]
    if any(s <= 0 or s > MAX_BYTES for s in sizes):
        raise ValueError(f"sizes must be in 1..{MAX_BYTES} bytes")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world_size else "gloo"
    work = Path(tempfile.mkdtemp(prefix="tunekit-allreduce-"))
    cfg = dict(sizes=sizes, warmup=warmup, repeats=repeats, backend=backend, timeout_s=timeout_s,
               out=str(work / "times.json"))
    status, payload, notes = "error", "", []
    try:
        _launch(world_size, cfg, work)
        payload = {int(k): v for k, v in json.loads((work / "times.json").read_text())["times"].items()}
        status = "ok"
    except _RankFailed as e:   # a rank failed: the agent has stopped the others
        payload = str(e)
    except (OSError, ValueError, KeyError) as e:   # rank 0 wrote no readable result
        payload = f"unreadable result ({type(e).__name__}: {e})"
    finally:
        shutil.rmtree(work, ignore_errors=True)
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

