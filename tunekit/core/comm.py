"""Expected communication of one data-parallel training step, from parameter shapes. Pure.

    >>> units = [[(384, 128), (128,)], [(255, 128)]]   # two fully_shard units' parameter shapes
    >>> expected_comm("fsdp", units, world=2, param_bytes=4, grad_bytes=4)["all_gather/intra"]
    {'count': 4, 'bytes': 656384}

Sizes follow the nccl-tests convention for a collective's "size": an all-gather counts its
gathered output, a reduce-scatter its unreduced input, an all-reduce and a broadcast their
buffer. The bytes each rank sends are a fixed fraction of that ((n-1)/n per pass of a ring).

What each sharding issues per optimizer step (U = fully_shard units holding parameters,
G = grad_accum micro-steps; gradient sync only on the last one):
- ``ddp``: gradients all-reduced once (in buckets, so the count is not fixed), buffers
  broadcast once (DDP's ``broadcast_buffers=True``: at the first forward after a gradient sync,
  so not again at the ``no_sync`` micro-steps). DDP's second iteration also
  broadcasts its rebuilt bucket order once (a few bytes): warm up 2 steps to leave it out.
- ``fsdp`` (FULL_SHARD): each unit all-gathered in forward and again in backward, its
  gradients reduce-scattered: 2*U*G all-gathers, U reduce-scatters.
- ``fsdp_grad_op`` (SHARD_GRAD_OP): parameters stay gathered from forward to backward: U*G
  all-gathers, U reduce-scatters.
- ``hsdp``: FULL_SHARD within a node (shard group = the node's ranks), then each rank's
  reduced gradient shard is all-reduced with the same shard on the other nodes: the only
  traffic that crosses nodes.
FSDP2 shards every parameter on dim 0 into ``ceil(d0 / shard)`` rows per rank, so a unit's
gathered size is its parameters padded to a multiple of the shard count on dim 0.
"""
from __future__ import annotations

import math

PARALLEL = ("ddp", "fsdp", "fsdp_grad_op", "hsdp")
KINDS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast")


def numel(shape) -> int:
    return math.prod(shape) if len(shape) else 1


def padded_numel(shape, shard: int) -> int:
    """Elements of a parameter after FSDP2 pads dim 0 to a multiple of ``shard``:
    (255, 128) over 2 ranks -> 128 rows each -> 256 * 128 = 32768."""
    if not len(shape):
        return shard  # a 0-d parameter is viewed as one row
    rows = -(-shape[0] // shard)  # ceil
    return rows * shard * numel(shape[1:])


def unit_gathered_numel(shapes, shard: int) -> int:
    """All-gather output (= reduce-scatter input) elements of one fully_shard unit."""
    return sum(padded_numel(s, shard) for s in shapes)


def _add(out: dict, kind: str, scope: str, count: int, nbytes: int) -> None:
    if count:
        entry = out.setdefault(f"{kind}/{scope}", {"count": 0, "bytes": 0})
        entry["count"] += count
        entry["bytes"] += nbytes


def expected_comm(parallel: str, units, world: int, nodes: int = 1, param_bytes: int = 4,
                  grad_bytes: int = 4, buffer_bytes: int = 0, grad_accum: int = 1) -> dict:
    """Collectives of one optimizer step as ``{"kind/scope": {"count", "bytes"}}``.

    ``units``: for FSDP, the parameter shapes of each fully_shard unit (blocks first, then the
    root's own); for DDP, one list with every trained parameter (a tied weight once).
    ``param_bytes``: bytes per element of the gathered parameters (MixedPrecisionPolicy's
    param_dtype), ``grad_bytes`` those of reduced gradients (its reduce_dtype). For DDP the
    all-reduce count is None (bucketing decides it) and only its bytes are predicted.
    """
    if parallel not in PARALLEL:
        raise ValueError(f"parallel must be one of {PARALLEL}, got {parallel!r}")
    if world % nodes:
        raise ValueError(f"world={world} ranks do not split into {nodes} nodes")
    units = [list(u) for u in units if len(u)]
    out: dict = {}
    across = "inter" if nodes > 1 else "intra"
    if parallel == "ddp":
        grads = sum(numel(s) for u in units for s in u) * grad_bytes
        out[f"all_reduce/{across}"] = {"count": None, "bytes": grads}
        if buffer_bytes:
            _add(out, "broadcast", across, 1, buffer_bytes)
        return out
    shard = world // nodes if parallel == "hsdp" else world
    within = "intra" if parallel == "hsdp" else across
    gathered = [unit_gathered_numel(u, shard) for u in units]
    passes = 1 if parallel == "fsdp_grad_op" else 2
    if shard == 1:  # nothing to gather or scatter: a shard is the whole parameter
        passes, gathered_rs = 0, 0
    else:
        gathered_rs = sum(gathered)
    _add(out, "all_gather", within, passes * len(units) * grad_accum,
         passes * grad_accum * sum(gathered) * param_bytes)
    _add(out, "reduce_scatter", within, len(units) if shard > 1 else 0, gathered_rs * grad_bytes)
    if parallel == "hsdp" and nodes > 1:
        _add(out, "all_reduce", "inter", len(units), sum(g // shard for g in gathered) * grad_bytes)
    return out


def total_by(comm: dict, axis: str) -> dict:
    """Sum a ``{"kind/scope": {...}}`` table over one axis: ``axis="kind"`` -> per kind,
    ``"scope"`` -> per scope. A None count stays None."""
    pos = 0 if axis == "kind" else 1
    out: dict = {}
    for key, v in comm.items():
        name = key.split("/")[pos]
        e = out.setdefault(name, {"count": 0, "bytes": 0})
        e["count"] = None if v["count"] is None or e["count"] is None else e["count"] + v["count"]
        e["bytes"] += v["bytes"]
    return out


def layout_problems(parallel, nproc, nodes) -> list[str]:
    """Why ``parallel`` over ``nodes`` nodes of ``nproc`` ranks cannot run (empty: it can)."""
    from tunekit.core.validate import is_whole

    out = []
    if parallel not in PARALLEL:
        out.append(f"parallel must be one of {PARALLEL} (or None for one process), got {parallel!r}.")
    for name, v in (("nproc", nproc), ("nodes", nodes)):
        if not is_whole(v) or v < 1:
            out.append(f"{name} must be a whole number >= 1, got {v!r}.")
    if not out and parallel == "hsdp" and nodes < 2:
        out.append(f"hsdp replicates across nodes and shards within one: it needs nodes >= 2 "
                   f"(got nodes={nodes}); use fsdp for one node.")
    return out
