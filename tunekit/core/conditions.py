"""Under what conditions a figure was measured: did anything else use the machine? Pure.

The documents' first rule of throughput work is a stable environment: change one thing and keep
everything else still. A timing taken while other work ran measures that work too, so every
record carries a `Conditions`: the raw readings and one verdict, ``quiet`` or ``busy`` (or
``unknown`` where nothing could be read), with the reason in words. Busy figures are shown as
such and never judged (`tunekit.verdict`, autotune).

What decides (each reading is a fraction of the measured wall time, so short and long blocks
are judged alike):
- CPU wait: the time during which some runnable task waited for a CPU (Linux PSI
  ``/proc/pressure/cpu``, microsecond resolution; without PSI, this thread's run-queue wait from
  ``/proc/self/schedstat``). A quiet machine shows ~0; two busy processes beside a 2-thread
  torch step show ~100%. It makes a block busy only from ``CPU_WAIT_MIN_S`` (2 ms) of wait on, so
  a shorter block (a trivial profiled cell) may leave it unread: "CPU wait not read", NaN.
- other processes' CPU use (``/proc/stat`` busy time minus this process's CPU time), trusted
  only when the block is long enough for /proc/stat's clock-tick resolution;
- steal (``/proc/stat``): time the hypervisor gave this VM's CPUs to someone else;
- on a GPU: other processes with a context on the device, and clock slowdowns that are not the
  workload's own (thermal, hardware slowdown, power brake).
The 1-minute load average is kept for the reader but never decides: it lags by about a minute,
so it would call the first quiet minute after a busy one busy.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from tunekit.core.fmt import fmt_pct
from tunekit.core.units import is_missing

NaN = math.nan
QUIET, BUSY, UNKNOWN = "quiet", "busy", "unknown"
VERDICTS = (QUIET, BUSY, UNKNOWN)

CPU_WAIT_BUSY = 0.20      # a task waited for a CPU during >= 20% of the block ...
CPU_WAIT_MIN_S = 0.002    # ... and >= 2 ms in all (one scheduler tick in a 5 ms cell is not a busy machine)
OTHERS_BUSY_CPUS = 0.5    # other processes used >= half a CPU on average (beyond /proc/stat's resolution)
STEAL_BUSY = 0.05         # the hypervisor took >= 5% of this VM's CPU time
# GPU clock slowdowns that come from outside the workload (NVML clocks-event reasons)
GPU_THROTTLE_BUSY = ("thermal", "hw slowdown", "hw thermal", "power brake")


@dataclass(frozen=True)
class Conditions:
    """What else used the machine while a block ran, and the verdict in words.

    >>> str(rec.conditions)
    'busy: tasks waited for a CPU 97% of the time; other processes used 1.0 of 2 CPUs'
    """

    verdict: str                     # quiet | busy | unknown
    reason: str                      # the verdict's reason, in words
    wall_s: float = NaN
    cpus: int | None = None          # CPUs this machine has
    threads: int | None = None       # threads the measured work could use (torch's intra-op pool)
    cpu_wait: float = NaN            # fraction of wall time some task waited for a CPU
    wait_source: str | None = None   # "psi" | "schedstat" (this thread only) | None
    others_cpus: float = NaN         # CPUs' worth of time other processes used, on average
    cpu_share: float = NaN           # CPU time this process got / (wall x threads)
    steal: float = NaN               # fraction of the CPUs' time taken by the hypervisor
    load_avg: float = NaN            # 1-minute load average at the end (never decides; NaN: a block < 2 ms)
    gpu_other_processes: int | None = None
    gpu_throttle: str | None = None  # NVML clocks-event reasons seen, comma-separated

    @property
    def busy(self) -> bool:
        return self.verdict == BUSY

    def __str__(self) -> str:
        return f"{self.verdict}: {self.reason}"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d) -> "Conditions | None":
        """Back from a log line; None for anything that is not a conditions dict."""
        if isinstance(d, Conditions) or d is None:
            return d
        if not isinstance(d, dict) or d.get("verdict") not in VERDICTS:
            return None
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def resolved(wall_s: float, cpus: int | None, tick_s: float = 0.01) -> bool:
    """Whether a block of ``wall_s`` is long enough for /proc/stat's clock ticks to say what
    other processes used (its error at most 0.1 CPU): shorter, `judge` leaves them out."""
    return cpus is not None and wall_s >= 10 * tick_s * cpus


def judge(wall_s: float, cpus: int | None = None, threads: int | None = None, *,
          cpu_wait_s: float | None = None, wait_source: str | None = None,
          busy_cpu_s: float | None = None, own_cpu_s: float | None = None,
          group_cpu_s: float | None = None, steal_s: float | None = None, tick_s: float = 0.01,
          load_avg: float | None = None,
          gpu_other_processes: int | None = None, gpu_throttle=()) -> Conditions:
    """The verdict from raw readings over a block of ``wall_s`` seconds.

    ``cpu_wait_s``: time some task waited for a CPU; ``busy_cpu_s``: non-idle CPU time of the
    whole machine (all CPUs); ``own_cpu_s``: CPU time of the measured process; ``group_cpu_s``:
    of all the processes that are the measured work (the ranks of a run on this machine: they are
    not 'other processes' to each other), default ``own_cpu_s``;
    ``steal_s``: hypervisor steal summed over the CPUs; ``tick_s``: /proc/stat's resolution.

    >>> judge(1.0, 2, 2, cpu_wait_s=0.97, wait_source="psi", busy_cpu_s=2.0, own_cpu_s=1.0).verdict
    'busy'
    """
    kw = dict(wall_s=wall_s, cpus=cpus, threads=threads, wait_source=wait_source,
              load_avg=NaN if load_avg is None else float(load_avg),
              gpu_other_processes=gpu_other_processes,
              gpu_throttle=", ".join(gpu_throttle) or None)
    if is_missing(wall_s) or wall_s <= 0:
        return Conditions(UNKNOWN, "no time was measured", **kw)
    wait = NaN if cpu_wait_s is None else min(1.0, max(0.0, cpu_wait_s / wall_s))
    share = NaN if own_cpu_s is None or not threads else own_cpu_s / (wall_s * threads)
    others = steal = NaN
    long_enough = resolved(wall_s, cpus, tick_s)
    group = own_cpu_s if group_cpu_s is None else group_cpu_s
    if busy_cpu_s is not None and group is not None:
        others = max(0.0, (busy_cpu_s - group) / wall_s)
    if steal_s is not None and cpus:
        steal = max(0.0, steal_s / (wall_s * cpus))
    kw.update(cpu_wait=wait, cpu_share=share, others_cpus=others, steal=steal)

    busy = []
    who = "tasks" if wait_source == "psi" else "this thread"
    # With a long enough window /proc/stat says who used the CPUs: a wait while other processes
    # stayed near idle is this work's own threads queueing (more threads than CPUs), not a busy machine.
    own_wait = long_enough and not is_missing(others) and others < OTHERS_BUSY_CPUS / 2
    if not is_missing(wait) and wait >= CPU_WAIT_BUSY and cpu_wait_s >= CPU_WAIT_MIN_S and not own_wait:
        busy.append(f"{'tasks' if wait_source == 'psi' else 'this thread'} waited for a CPU "
                    f"{fmt_pct(wait, 0)} of the time")
    if long_enough and not is_missing(others) and others >= OTHERS_BUSY_CPUS:
        busy.append(f"other processes used {others:.1f} of {cpus} CPUs")
    if long_enough and not is_missing(steal) and steal >= STEAL_BUSY:
        busy.append(f"the hypervisor took {fmt_pct(steal, 0)} of the CPU time (steal)")
    if gpu_other_processes:
        busy.append(f"{gpu_other_processes} other process{'es' if gpu_other_processes > 1 else ''} "
                    "on the GPU")
    slow = [r for r in gpu_throttle if r in GPU_THROTTLE_BUSY]
    if slow:
        busy.append(f"GPU clocks slowed ({', '.join(slow)})")
    if busy:
        if not is_missing(share) and share < 0.9:
            busy.append(f"this process got {fmt_pct(share, 0)} of its "
                        + (f"{threads} threads' time" if threads != 1 else "1 thread's time"))
        return Conditions(BUSY, "; ".join(busy), **kw)
    # a counter there but left unread (a lean meter's stop): below CPU_WAIT_MIN_S no wait could
    # make the block busy, so nothing was lost; longer, the wait is simply missing
    unread = cpu_wait_s is None and wait_source is not None and wall_s < CPU_WAIT_MIN_S
    if is_missing(wait) and not unread and not long_enough and gpu_other_processes is None:
        return Conditions(UNKNOWN, "no CPU-wait counter here (Linux PSI or schedstat) and the block "
                                   "was too short for /proc/stat", **kw)
    said = []
    if unread:
        said.append(f"CPU wait not read: a block under {CPU_WAIT_MIN_S * 1e3:g} ms is never busy by it")
    if not is_missing(wait):
        said.append(f"{who} waited for a CPU {fmt_pct(wait, 0)} of the time")
        if own_wait and wait >= CPU_WAIT_BUSY:
            said[-1] += " (this work's own threads: more threads than free CPUs)"
    if long_enough and not is_missing(others):
        said.append(f"other processes used {others:.2f} CPUs")
    return Conditions(QUIET, "; ".join(said) or "nothing else used the machine", **kw)


def combine(parts, labels=None) -> Conditions | None:
    """One verdict over several measured windows (the repeats of a setting, the ranks of a run):
    busy if any was busy, unknown if none could be judged, quiet otherwise. The readings are the
    worst seen."""
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    labels = labels or [None] * len(parts)
    busy = [(lab, p) for lab, p in zip(labels, parts) if p.busy]
    if busy:
        verdict = BUSY
        said = list(dict.fromkeys(f"{lab}: {p.reason}" if lab else p.reason for lab, p in busy))
        reason = "; ".join(said[:2])  # the same reason from several repeats is said once
        if len(said) > 2:
            reason += f" (and {len(said) - 2} more)"
        if len(parts) > 1:
            reason = f"{len(busy)} of {len(parts)} busy: {reason}"
    elif all(p.verdict == UNKNOWN for p in parts):
        verdict, reason = UNKNOWN, parts[0].reason
    else:
        verdict, reason = QUIET, next(p.reason for p in parts if p.verdict == QUIET)

    def worst(name):
        vals = [getattr(p, name) for p in parts if not is_missing(getattr(p, name))]
        return max(vals) if vals else None

    share = [p.cpu_share for p in parts if not is_missing(p.cpu_share)]
    throttles = sorted({t for p in parts if p.gpu_throttle for t in p.gpu_throttle.split(", ")})
    return Conditions(
        verdict, reason, wall_s=sum(p.wall_s for p in parts if not is_missing(p.wall_s)),
        cpus=parts[0].cpus, threads=parts[0].threads, wait_source=parts[0].wait_source,
        cpu_wait=_or_nan(worst("cpu_wait")), others_cpus=_or_nan(worst("others_cpus")),
        cpu_share=min(share) if share else NaN, steal=_or_nan(worst("steal")),
        load_avg=_or_nan(worst("load_avg")), gpu_other_processes=worst("gpu_other_processes"),
        gpu_throttle=", ".join(throttles) or None)


def first_reason(reason: str) -> str:
    """The first (main) clause of a verdict's reason, for a one-line summary."""
    return reason.split("; ")[0]


def conclude(text: str, records) -> str:
    """A conclusion drawn from measurements, with the machine's condition beside it; when any of
    them was measured busy, that the conclusion is uncertain instead of the conclusion.

    ``records``: records with a ``.conditions`` (ProfileRecord, RunResult), Conditions, or one record.

    >>> conclude("matmuls take most of the step", traces)
    'matmuls take most of the step (machine quiet)'
    """
    if not isinstance(text, str):
        raise ValueError(f"conclude() needs the conclusion as text (got {type(text).__name__}).")
    if hasattr(records, "conditions") or isinstance(records, Conditions):
        records = [records]
    conds = [r if isinstance(r, Conditions) or r is None else getattr(r, "conditions", False) for r in records]
    if any(c is False or not (c is None or isinstance(c, Conditions)) for c in conds):
        raise ValueError("conclude() takes records with a .conditions (ProfileRecord, RunResult) or Conditions.")
    busy = [c for c in conds if c is not None and c.busy]
    if busy:
        return (f"uncertain: {len(busy)} of {len(conds)} measurements ran on a busy machine ("
                f"{first_reason(busy[0].reason)}); re-run when it is quiet")
    cond = combine(conds)
    return f"{text} (machine {UNKNOWN if cond is None else cond.verdict})"


def _or_nan(x):
    return NaN if x is None else x
