"""Rank 0's view of a monitored run under torch.distributed: every rank measures its own steps,
and at the end (never inside a timed step) one `all_gather_object` brings the summaries
together."""
from __future__ import annotations

import time
from dataclasses import dataclass

from tunekit.core.fmt import fmt_mib, fmt_ms, fmt_pct, fmt_rate
from tunekit.core.units import is_missing
from tunekit.monitor.steps import measured


@dataclass
class Ranks:
    """What the ranks measured, as rank 0 sees it."""

    world: int
    tokens_per_s: float      # global: every rank's measured tokens over the slowest rank's time
    mfu: list                # per device (rank order)
    peak_bytes: list         # each rank's highest memory (GPU peak, else CPU peak)
    gather_s: float          # the all_gather_object at close, outside any step
    line: str


def gather_ranks(summary, rows) -> Ranks | None:
    """None unless torch.distributed is initialized with more than one rank. Every rank must
    call it (``Monitor.close()`` does): it is a collective."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    good = [r for r in rows if measured(r)]
    mine = dict(amount=sum(r["tokens"] if not is_missing(r["tokens"]) else r["samples"] for r in good),
                seconds=sum(r["wall_s"] for r in good), mfu=summary.mfu,
                peak=summary.gpu_peak_bytes if not is_missing(summary.gpu_peak_bytes)
                else summary.cpu_peak_bytes)
    t0 = time.perf_counter()
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    spent = time.perf_counter() - t0
    slowest = max(e["seconds"] for e in every)
    rate = sum(e["amount"] for e in every) / slowest if slowest > 0 else float("nan")
    unit = summary.unit
    line = (f"{len(every)} ranks: {fmt_rate(rate, unit)} in all (every rank's over the slowest rank's "
            f"time), MFU per device " + ", ".join(fmt_pct(e["mfu"]) for e in every) +
            ", peak memory per rank " + ", ".join(fmt_mib(e["peak"], 0) for e in every) +
            f"; gathered at close in {fmt_ms(spent)}, outside the steps")
    return Ranks(len(every), rate, [e["mfu"] for e in every], [e["peak"] for e in every], spent, line)
