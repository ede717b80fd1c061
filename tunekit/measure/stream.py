"""This machine's memory bandwidth by working-set size, its time per op, per view and per module
call, and its matmuls' TFLOPS as a step runs them, measured: what a CPU plan's expectation
(core.expected) takes for memory-bound ops, each op's dispatch, the host's time for what launches
no kernel and the matmuls up to 1024-cubes; above those it takes the calibrated MAMF sweep's
(measure.peaks), where compute outweighs the operands' trips to memory. Measurement layer.

The bandwidth is a training step's, not a hot copy's: a chain of elementwise multiplies whose
outputs autograd keeps for the backward, as a forward keeps its activations (each writes memory
not yet in cache, often freshly mapped), then freed by the backward; each multiply reads 2n bytes
and writes n. A hot ``copy_`` of the same size runs 2-3x faster on a CPU whose caches hold it, a
rate no step's forward sees. The sizes run from cache-resident to beyond the last-level cache.
Ops that read a tensor written long before are swept twice more: after the last-level cache was
flushed (``cold``) and after only a core's L2 was (``warm``), the cache sizes as sysfs lists them.

Every figure is the fastest of repeated trials, taken round-robin over all of them (measure.trials
`interleaved`: each round runs every figure's trial in turn, so a figure's trials are spread over the
whole calibration rather than taken back to back in one window of a machine whose slow spells last
seconds); the compute figures' matmul trials (measure.step_compute) write into buffers faulted in
before them, so their time does not follow the allocator's history.
Measured once per machine, torch and thread count (the cache key), cached as JSON beside the MAMF
cache (core.paths.cache_dir) and read from it ever after, whatever the load: a plan is a function of
its setting, its device and this record. Measured again only on request (``measure_stream(refresh=True)``)
or for a new key. The key holds libgomp's wait policy (measure.conditions_gomp): its small matmuls run
at another speed under another policy, so a record taken under one is another calibration, not this
one's. The sweep runs inside a `ConditionsMeter`: a record taken on a busy machine says so
(``conditions``), and a plan made from it carries a note of kind ``expected.busy_figures``.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from tunekit.core import paths
from tunekit.core.conditions import Conditions
from tunekit.core.registry import BF16, FP32
from tunekit.core.validate import flag
from tunekit.measure.conditions import ConditionsMeter
from tunekit.measure.conditions_gomp import DEFAULT, policy
from tunekit.measure.priority import NORMAL, level, shielded_verdict
from tunekit.measure.step_compute import (  # noqa: F401 (MATMUL_SIZES: as before)
    MATMUL_SIZES,
    compute_figures,
    compute_trials,
    shape_figures,
)
from tunekit.measure.step_host import (  # noqa: F401 (SIZES .. cache_levels: as before)
    CHAIN,
    SIZES,
    TINY_PER_ROUND,
    WARM_SIZES,
    cache_bytes,
    cache_levels,
    host_figures,
    host_trials,
)
from tunekit.measure.trials import MAX_TRIES, TRIES, Trial, best_s, fastest, interleaved  # noqa: F401 (as before)

VERSION = 17   # of what a sweep measures (9: trials ahead of the load; 10: compute figures in warm rounds;
# 11: matmul outputs in buffers faulted in before the trials; 14: a linear layer's matmul shapes and the
# L2-evicted sweep; 12 and 13 were drafts of 14 on one machine; 15: every figure's trials interleaved over
# the whole calibration, each the fastest of 8-12 rounds; 16: the 64-cube matmul the faster of torch's
# threads and one, measure.step_compute.or_one_thread; 17: the shape classes in bf16 too, from 256 tokens):
# an entry of another version is measured again


@dataclass
class Stream:
    """Bandwidth sweeps ((bytes one op moves, TB/s), ...), the seconds one small op takes, and how
    it was taken. ``sweep``: ops whose inputs are in cache (a forward's chain); ``cold``: ops that
    read a tensor written long before (a backward reading what the forward saved, an optimizer
    reading its state)."""

    device: str
    sweep: list
    cold: list
    op_s: float
    matmuls: dict      # dtype -> [(n, TFLOPS of an n x n x n matmul, its layouts' mean time)]
    attention: dict    # dtype -> TFLOPS of causal SDPA forward + backward (7 b h s^2 d FLOPs)
    gelu: dict         # dtype -> elements per second of GELU (tanh) forward + backward, per pass
    view_s: float      # one view op's dispatch (no kernel): a chain of them forward and back, per op
    module_s: float    # one nn.Module call's own time, around what its forward runs
    checkpoint_s: tuple  # torch's non-reentrant checkpoint's own time: (per segment, per tensor it saves)
    torch_version: str
    threads: int
    taken_at: float
    conditions: Conditions | None = None
    priority: str = NORMAL   # what its trials ran at (measure.priority): "realtime" ones are load-proof
    wait_policy: str = DEFAULT   # libgomp's, as its threads ran the trials (measure.conditions_gomp)
    # dtype -> [(layout, tokens, features, TFLOPS)]: a linear layer's matmuls (measure.step_compute.shape_figures)
    shapes: dict = field(default_factory=dict)
    # like ``cold``, for ops that read a tensor the core's L2 no longer holds but the last-level cache does
    warm: list = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return shielded_verdict(self.conditions, self.priority)



def _key(name: str) -> str:
    import torch

    return f"{name}|torch {torch.__version__}|{torch.get_num_threads()} threads|v{VERSION}|omp {policy()}"


def _load() -> dict:
    return paths.read_cache("stream.json")


def _from(entry: dict) -> Stream:
    cond = Conditions.from_dict(entry.get("conditions")) if entry.get("conditions") else None
    return Stream(**{**entry, "sweep": [tuple(x) for x in entry["sweep"]], "cold": [tuple(x) for x in entry["cold"]],
                     "conditions": cond, "checkpoint_s": tuple(entry["checkpoint_s"]),
                     "matmuls": {k: [tuple(x) for x in v] for k, v in entry["matmuls"].items()},
                     "attention": dict(entry["attention"]), "gelu": dict(entry["gelu"]),
                     "shapes": {k: [tuple(x) for x in v] for k, v in entry.get("shapes", {}).items()},
                     "warm": [tuple(x) for x in entry.get("warm", [])]})


def measure_stream(refresh: bool = False, say=None) -> Stream:
    """This CPU's figures: from the cache when it holds this machine's, torch's, thread count's and
    OpenMP wait policy's (whatever the load it was taken under: its ``conditions`` say), else measured once and cached.
    ``refresh=True`` measures them again and replaces the cached record (say at a quiet moment,
    after a busy first calibration). ``say``: told how far a measurement is ("round 3 of 8 to 12"), to show it."""
    import torch

    from tunekit.measure.peaks import device_name

    flag("refresh", refresh)
    name = device_name("cpu")
    key = _key(name)
    cache = _load()
    if key in cache and not refresh:
        try:
            return _from(cache[key])
        except (KeyError, TypeError, ValueError):   # an entry of another tunekit's making: measured again
            pass
    meter = ConditionsMeter().start()
    t0 = time.perf_counter()
    kinds = ((FP32, torch.float32), (BF16, torch.bfloat16))
    host = host_trials()
    best = interleaved({**host, **{k: Trial(t, warm=True) for k, t in compute_trials(kinds).items()}}, say=say)
    sweep, cold, warm, best_op, view_s, module_s, checkpoint_s = host_figures(best)
    matmuls, attention, gelu = compute_figures(best, kinds)
    new = Stream(device=name, sweep=sweep, cold=cold, op_s=best_op, matmuls=matmuls, view_s=view_s, module_s=module_s,
                 checkpoint_s=checkpoint_s, attention=attention, gelu=gelu, torch_version=torch.__version__,
                 threads=torch.get_num_threads(), taken_at=time.time(),
                 conditions=meter.stop(time.perf_counter() - t0), priority=level(), wait_policy=policy(),
                 shapes=shape_figures(best), warm=warm)
    cache[key] = {**asdict(new), "conditions": new.conditions.to_dict() if new.conditions else None}
    _save(cache)
    return new


def figures(entry: dict) -> dict:
    """One stream record (a cache entry, as `measure_stream` writes it) as named numbers: every
    figure a plan reads, one by one (each bandwidth by its size, each matmul by dtype and size), so
    two calibrations can be compared figure by figure (benchmarks/bench_calibration.py --spread)."""
    out = {}
    for what in ("sweep", "cold"):
        out.update({f"{what} {moved // 3 // 1024} KiB": tbs for moved, tbs in entry[what]})
    out.update({k: entry[k] for k in ("op_s", "view_s", "module_s")})
    out["checkpoint_s segment"], out["checkpoint_s tensor"] = entry["checkpoint_s"]
    for what in ("gelu", "attention"):
        out.update({f"{what} {d}": v for d, v in entry[what].items()})
    for d, rows in entry["matmuls"].items():
        out.update({f"matmuls {d} {row[0]}": row[1] for row in rows})
    out.update({f"warm {moved // 3 // 1024} KiB": tbs for moved, tbs in entry.get("warm", [])})
    for d, rows in entry.get("shapes", {}).items():
        out.update({f"shape {d} {layout} {long}x{wide}": tflops for layout, long, wide, tflops in rows})
    return out


def _save(data: dict) -> None:
    paths.write_cache("stream.json", data)
