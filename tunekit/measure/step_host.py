"""This CPU's host figures as a training step meets them: its memory bandwidth by working-set size
(a forward's chain whose outputs autograd keeps, ``sweep``; the same reading tensors written before
the last-level cache was flushed, ``cold``, or only a core's L2, ``warm``), one op's, one view's, one
module call's and one checkpoint segment's own time: their trials (`host_trials`) and the figures
from each trial's fastest seconds (`host_figures`), for the stream record (measure.stream), whose
trials run interleaved with the compute figures' (measure.step_compute; `trials.interleaved`).
Measurement layer.
"""
from __future__ import annotations

import os
import time

from tunekit.measure.trials import Trial, built

SIZES = (2**16, 2**18, 2**20, 2**22, 2**24, 2**26)   # bytes copied: 64 KiB .. 64 MiB
WARM_SIZES = SIZES[:4]   # the L2-evicted sweep's: up to 4 MiB an operand (its chain's saved tensors fit an L3)
CHAIN = 50
TINY_PER_ROUND = 3   # timed trials a round of a figure of microseconds (op, view, module, checkpoint)


def host_trials() -> dict:
    """The trials of a record's host figures, by name (`Trial`s for `trials.interleaved`), in the
    order a round takes them: the kept-output sweep (("sweep", bytes)), the cold one (("cold", bytes))
    and the L2-evicted one (("warm", bytes)), then the op chain, the view chain, the module calls
    and the checkpoint's six (("checkpoint", k, kind)). `host_figures` makes the figures of their
    fastest seconds.

    ``cold``: the sweep's multiplies reading tensors written before the last-level cache was flushed;
    ``warm``: the same with only a core's L2 flushed (`WARM_SIZES`, whose saved tensors the last-level
    cache can hold), as a step's op reads a tensor a few ops back; none where sysfs lists no L2. Their
    saved tensors are slices of one pool (`_saved_pool`), so all sizes' trials live at once in 256 MiB."""
    import torch

    trials = {("sweep", n): built(_kept_trial, n) for n in SIZES}
    pool = built(_saved_pool)
    flush = torch.empty(_flush_bytes() // 4)
    trials.update({("cold", n): built(_cold_trial, n, flush, pool) for n in SIZES})
    levels = cache_levels()
    l2, l3 = levels.get(2), max(levels.values(), default=None)
    if l2 and l3 and l3 > 4 * l2:
        l2_flush = torch.empty(4 * l2 // 4)   # 4 x L2: out of a core's L2, well within the L3
        # the saved tensors a quarter of the L3 at most (their outputs as much again): read from it, not memory
        # warm: an untimed trial first brings the saved tensors into the L3 (another figure's trial ran before)
        trials.update({("warm", n): built(_cold_trial, n, l2_flush, pool, ops=max(2, min(50, l3 // 4 // n)),
                                          warm=True) for n in WARM_SIZES})
    trials["op"] = built(_tiny, _op_chain(), 2 * CHAIN + 1)
    trials["view"] = built(_tiny, _view_chain(), 2 * CHAIN)
    trials["module"] = built(_tiny, _module_chain(), CHAIN)
    trials.update(built(_checkpoint_trials))
    return trials


def host_figures(best: dict) -> tuple:
    """(sweep, cold, warm, op_s, view_s, module_s, checkpoint_s) of a record from its host trials'
    fastest seconds (``best``, by `_host_trials`' names): each multiply reads two tensors of n bytes
    and writes one, 3n bytes moved per op; the checkpoint's own time per segment at k = 1 and k = 20
    one-element multiplies (checkpointed less plain less the recompute's forward, over CHECKPOINT_BLOCKS
    segments), solved for its cost per segment and per tensor it saves."""
    def sweep_of(what):
        return [(3 * n, 3 * n / best[what, n] / 1e12) for n in SIZES if (what, n) in best]

    def per_segment(k):
        return (best["checkpoint", k, "checkpointed"] - best["checkpoint", k, "plain"]
                - best["checkpoint", k, "forward"]) / CHECKPOINT_BLOCKS

    one, twenty = per_segment(1), per_segment(20)
    per_tensor = max(0.0, (twenty - one) / 19)
    return (sweep_of("sweep"), sweep_of("cold"), sweep_of("warm"), best["op"], best["view"], best["module"],
            (max(0.0, one - per_tensor), per_tensor))


def _tiny(fn, per: int) -> Trial:
    """A figure of microseconds: ``fn``'s seconds over ``per``, `TINY_PER_ROUND` a round, warm."""
    def run():
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) / per

    fn()
    return Trial(run, TINY_PER_ROUND, warm=True)


def _op_chain():
    """A training step's op, recorded by autograd and run again as a backward formula: a chain of
    CHAIN one-element multiplies forward and back (2 x CHAIN + 1 ops)."""
    import torch

    x = torch.ones(1, requires_grad=True)

    def chain():
        y = x
        for _ in range(CHAIN):
            y = y * 1.0001
        y.backward()

    return chain


def _kept_trial(nbytes: int) -> Trial:
    """One multiply of two fp32 tensors of ``nbytes`` whose output autograd keeps for the backward:
    the forward of a chain of them (50, fewer past 4 MiB: at most 256 MiB kept), per op, each trial
    followed by the backward that frees the chain (untimed); warm, as its trials back to back were."""
    import torch

    n, ops = nbytes // 4, max(2, min(50, 2**28 // nbytes))
    # w needs a gradient too, so each multiply's backward needs its input: autograd keeps every output
    x, w = torch.ones(n, requires_grad=True), torch.full((n,), 1.0001, requires_grad=True)

    def forward_s():
        t0 = time.perf_counter()
        y = x
        for _ in range(ops):
            y = y * w
        t = time.perf_counter() - t0
        y.sum().backward()
        x.grad = w.grad = None
        return t / ops

    forward_s()
    return Trial(forward_s, warm=True)


def cache_bytes() -> int | None:
    """The largest CPU cache sysfs lists (the last-level cache), None where it lists none."""
    return max(cache_levels().values(), default=None)


def cache_levels() -> dict:
    """{level: bytes} of cpu0's data and unified caches as sysfs lists them (the spec of this CPU:
    on the 2-vCPU EPYC VM {1: 32 KiB, 2: 1 MiB, 3: 32 MiB}); {} where it lists none."""
    try:
        base = "/sys/devices/system/cpu/cpu0/cache"
        out: dict = {}
        for index in sorted(i for i in os.listdir(base) if i.startswith("index")):
            def read(what, index=index):
                with open(f"{base}/{index}/{what}") as f:
                    return f.read().strip()
            if read("type") == "Instruction":
                continue
            text = read("size")
            size = int(text[:-1]) * {"K": 2**10, "M": 2**20, "G": 2**30}[text[-1]] if text[-1] in "KMG" else int(text)
            out[int(read("level"))] = max(size, out.get(int(read("level")), 0))
        return out
    except (OSError, ValueError, KeyError):
        return {}


def _flush_bytes() -> int:
    """Bytes whose writing evicts the last-level cache: four times its size, 64-512 MiB."""
    return min(max(4 * (cache_bytes() or 32 * 2**20), 64 * 2**20), 512 * 2**20)


def _saved_pool():
    """256 MiB of fp32 1.0001: the saved tensors of every `_cold_trial` are slices of it (a chain's
    at most 2^28 bytes), contiguous and 64 KiB-aligned as tensors of their own would be."""
    import torch

    return torch.full((2**28 // 4,), 1.0001)


def _cold_trial(nbytes: int, flush, pool, ops: int | None = None, warm: bool = False) -> Trial:
    """One multiply as a backward runs it: a chain (its running tensor in cache, like the gradient)
    times tensors written before ``flush`` was written (like the activations the forward saved; their
    ``ops`` slices of ``pool``: None, 50, fewer past 4 MiB, at most 256 MiB), every output kept; per op.
    ``warm``: each timed trial after an untimed one (`Trial`)."""
    import torch

    n, ops = nbytes // 4, ops or max(2, min(50, 2**28 // nbytes))
    x = torch.ones(n, requires_grad=True)
    saved = [pool[i * n:(i + 1) * n] for i in range(ops)]

    def trial():
        flush.fill_(0.0)
        t0 = time.perf_counter()
        y, kept = x, []
        for s in saved:
            y = y * s
            kept.append(y)
        t = time.perf_counter() - t0
        del kept, y
        return t / ops

    trial()   # a warm-up
    return Trial(trial, warm=warm)


def _view_chain():
    """A chain of CHAIN views (a reshape that moves no data, as a model's ``view``, ``transpose`` and
    slices) of a tensor that needs a gradient, and the backward that runs each one's view of the
    gradient: 2 x CHAIN dispatches."""
    import torch

    x = torch.ones(4, 8, requires_grad=True)

    def chain():
        y = x * 1.0
        for i in range(CHAIN):
            y = y.view(32) if i % 2 == 0 else y.view(4, 8)
        y.sum().backward()

    return chain


def _module_chain():
    """CHAIN ``nn.Module`` calls whose forward returns its input, in turn: each call's own time
    around its forward."""
    import torch

    class Same(torch.nn.Module):
        def forward(self, z):
            return z

    mods, x = [Same() for _ in range(CHAIN)], torch.ones(1)

    def chain():
        y = x
        for m in mods:
            y = m(y)

    return chain


CHECKPOINT_BLOCKS = 20


def _checkpoint_trials() -> dict:
    """torch's non-reentrant checkpoint's own time, as trials: CHECKPOINT_BLOCKS segments of k
    one-element multiplies (each saves one tensor), at k = 1 and k = 20, each run three ways
    (("checkpoint", k, kind)): checkpointed forward and backward, plain forward and backward, and
    the plain forward alone (what the checkpoint recomputes); `host_figures` solves for the costs."""
    import torch
    from torch.utils.checkpoint import checkpoint

    w = torch.full((1,), 1.0001)
    trials = {}
    for k in (1, 20):
        x = torch.ones(1, requires_grad=True)

        def block(y, k=k):
            for _ in range(k):
                y = y * w
            return y

        def checkpointed(x=x, block=block):
            y = x
            for _ in range(CHECKPOINT_BLOCKS):
                y = checkpoint(block, y, use_reentrant=False)
            y.sum().backward()

        def plain(x=x, block=block):
            y = x
            for _ in range(CHECKPOINT_BLOCKS):
                y = block(y)
            y.sum().backward()

        def forward(x=x, block=block):
            y = x
            for _ in range(CHECKPOINT_BLOCKS):
                y = block(y)

        for kind, fn in (("checkpointed", checkpointed), ("plain", plain), ("forward", forward)):
            trials["checkpoint", k, kind] = _tiny(fn, 1)
    return trials
