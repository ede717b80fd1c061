"""A plan across ranks: what one rank holds under DDP or FSDP2 sharding, and the time its
collectives take on the device's links. Pure: numbers in, numbers out.

Per rank (rank 0, the one FSDP2 gives the most rows):
- ``ddp`` replicates everything, and its Reducer keeps a flat copy of every gradient in its
  buckets (``gradient_as_bucket_view=False``, torch's default: "the saved memory size will be
  equal to the total gradients size" when it is True).
- ``fsdp`` / ``hsdp`` / ``fsdp_grad_op`` shard parameters, gradients, optimizer state and
  master weights on dim 0 into ``ceil(d0 / shard)`` rows per rank (`core.comm.padded_numel`).
  Gathered parameters (MixedPrecisionPolicy's param dtype) replace autocast's weight copies:
  FULL_SHARD keeps the root unit (never resharded after forward) and two blocks (the one running
  and the one prefetched) gathered; SHARD_GRAD_OP keeps every unit gathered from its forward to
  its backward. One unit's gradients exist unsharded (fp32) until they are reduce-scattered.

    >>> units = [[(4, 3)], [(4, 3)], [(5, 3)]]            # two blocks, then the root's own
    >>> shard_fraction(units, 2)          # rank 0: (2*3 + 2*3 + 3*3) of (12 + 12 + 15) elements
    0.5384615384615384
"""
from __future__ import annotations

from tunekit.core.comm import expected_comm, layout_problems, numel, unit_gathered_numel
from tunekit.core.memory.answer import STATIC
from tunekit.core.specs import find_spec
from tunekit.core.units import GiB

# A node's network, what a collective whose ring crosses nodes runs at: the card's row gives the node
# it ships in (core.gpu.GPU.node_net: NICs per node, GB/s NCCL reaches through each, with its source;
# the reasoning and measurements beside the rows in core/gpus.py)
# a card whose row lists none: one 400 Gb/s NIC for the whole node
ONE_NIC = (1, 47.0, "no node network listed for this card: one 400 Gb/s NIC per node assumed, 46-48 GB/s "
                    "(NVIDIA/nccl-tests#290)")


def node_net(device_name: str | None) -> tuple[int, float, str]:
    """(NICs per node, GB/s NCCL reaches through each, the source) of ``device_name``'s node: its
    GPU row's `node_net`, or `ONE_NIC` where the row lists none (or the device is no GPU row).

    >>> node_net("A100 40GB")[:2]
    (8, 24.0)
    """
    row = find_spec(device_name)
    if row is None or row.node_net is None:
        return ONE_NIC
    nics, per_nic = row.node_net.value
    return nics, per_nic, row.node_net.source


def inter_node_gbs(net, link_gbs: float | None, gpus_per_node: int, groups_per_node: int = 1) -> float:
    """Bus bandwidth of a collective across nodes: the node's NICs shared by the ``groups_per_node``
    collectives that cross at once (HSDP's replicas: one per local rank, each with one GPU a node),
    capped by NVLink where a ring also runs inside the node.
    8 NICs at 47 GB/s, NVLink 450: one ring over whole nodes 376 GB/s; 8 replica groups 47 each."""
    nics, per_nic, _ = net
    gbs = nics * per_nic / groups_per_node
    if gpus_per_node // groups_per_node > 1 and link_gbs:
        gbs = min(gbs, link_gbs)
    return gbs


NCCL_BUFFERS = (1.5 * GiB, "torch.distributed/NCCL buffers after the first barrier, ~1.5 GiB per GPU "
                           "(stas00/ml-engineering training/performance/README.md, torch.distributed memory usage)")


def shard_count(parallel: str, world: int, nodes: int) -> int:
    """Ranks one parameter is split over: none for DDP, the node's for HSDP, all for FSDP."""
    return 1 if parallel == "ddp" else world // nodes if parallel == "hsdp" else world


def shard_fraction(units, shard: int) -> float:
    """Share of every parameter's elements that rank 0 holds: ceil(d0 / shard) of each one's rows.
    (4, 3) over 2 ranks -> 2 rows = 6 of 12; (5, 3) -> 3 rows = 9 of 15."""
    full = sum(numel(s) for u in units for s in u)
    mine = sum(unit_gathered_numel(u, shard) for u in units) / shard
    return mine / full if full else 1.0


def per_rank(components: dict, units, parallel: str, world: int, nodes: int, gathered_bytes: int,
             grad_bytes: int = 4, state_scalars: float = 0.0) -> tuple[dict, dict]:
    """(what rank 0 holds for the whole step, what it adds at the peak): ``components`` are one
    device's (a whole model's) bytes; ``units`` the parameter shapes of each fully_shard unit,
    blocks first and the root's own last (for DDP, one unit); ``gathered_bytes`` bytes per
    element of gathered parameters; ``state_scalars`` the optimizer state's 0-d tensors (AdamW's
    step counts), which every rank keeps whole."""
    out = dict(components)
    if parallel == "ddp":
        out["ddp_buckets"] = components.get("gradients", 0.0)
        return out, {}
    shard = shard_count(parallel, world, nodes)
    f = shard_fraction(units, shard)
    for k in STATIC:
        out[k] = components.get(k, 0.0) * f
    out["optimizer_states"] = (components.get("optimizer_states", 0.0) - state_scalars) * f + state_scalars
    out["weight_casts"] = 0.0
    gathered = sorted((unit_gathered_numel(u, shard) * gathered_bytes for u in units[:-1]), reverse=True)
    root = unit_gathered_numel(units[-1], shard) * gathered_bytes if units else 0
    held = sum(gathered) if parallel == "fsdp_grad_op" else sum(gathered[:2])
    extra = {"gathered_params": float(root + held),
             "unsharded_grads": float(max((unit_gathered_numel(u, shard) for u in units), default=0) * grad_bytes)}
    return out, extra


def comm_seconds(parallel: str, units, world: int, nodes: int, gathered_bytes: int, link_gbs: float | None,
                 inter_gbs: float | None = None, grad_bytes: int = 4, net=ONE_NIC) -> tuple[float, dict]:
    """(seconds, {"kind/scope": seconds}) one rank spends in one step's collectives at the links'
    bandwidth, ring algorithms: an all-gather or reduce-scatter of size S over n ranks moves
    S (n-1)/n through each rank's link, an all-reduce twice that (nccl-tests' bus bandwidth).
    Across nodes at ``inter_gbs`` where given, else at what the node's network ``net`` gives
    (`inter_node_gbs`). NaN when a link bandwidth is unknown."""
    comm = expected_comm(parallel, units, world, nodes, gathered_bytes if parallel != "ddp" else grad_bytes,
                         grad_bytes)
    shard = shard_count(parallel, world, nodes)
    per_node = world // nodes
    out = {}
    for key, v in comm.items():
        kind, scope = key.split("/")
        n = nodes if (parallel == "hsdp" and scope == "inter") else (world if parallel == "ddp" else shard)
        passes = {"all_reduce": 2.0, "broadcast": 1.0}.get(kind, 1.0)
        share = passes * (n - 1) / n if kind != "broadcast" else 1.0
        if scope == "intra":
            gbs = link_gbs
        elif inter_gbs is not None:
            gbs = inter_gbs
        else:   # HSDP: each local rank's replicas all-reduce at once, one GPU a node each
            gbs = inter_node_gbs(net, link_gbs, per_node, per_node if parallel == "hsdp" else 1)
        out[key] = (v["bytes"] * share / (gbs * 1e9)) if gbs else float("nan")
    return sum(out.values()), out


def rank_peak(peak: float, components: dict, grads_at_peak: float, units, parallel: str | None, world: int,
              nodes: int, gathered_bytes: int, state_scalars: float = 0.0, grad_bytes: int = 4,
              phase: str = "backward", casts_at_peak: float | None = None) -> tuple[dict, float]:
    """(rank 0's components, its peak): one device's peak with its whole-model lines swapped for
    rank 0's. At the peak, weights, master weights and optimizer state are whole and gradients
    are ``grads_at_peak`` of them; sharding keeps ``shard_fraction`` of each. At a forward's or
    backward's peak autocast's weight copies are alive, and FSDP replaces them with gathered
    parameters (and, in backward, one unit's unsharded gradients); the optimizer's step runs on
    the shards alone. DDP adds its buckets throughout. ``casts_at_peak``: the weight casts alive at
    this phase's peak where measured (autocast's cache holds every weight's copy until the forward
    ends, checkpointed or not), else the step's ``weight_casts`` (those kept for backward)."""
    if parallel is None:
        return dict(components), peak
    comps, extra = per_rank(components, units, parallel, world, nodes, gathered_bytes, grad_bytes, state_scalars)
    if parallel == "ddp":
        return comps, peak + comps["ddp_buckets"]
    f = shard_fraction(units, shard_count(parallel, world, nodes))
    whole = sum(components.get(k, 0.0) for k in ("weights", "master_weights", "optimizer_states")) - state_scalars
    out = peak - (whole + grads_at_peak) * (1 - f)
    if phase != "optimizer step":
        casts = components.get("weight_casts", 0.0) if casts_at_peak is None else casts_at_peak
        out += extra["gathered_params"] - casts
    if phase == "backward":
        out += extra["unsharded_grads"]
    comps.update(extra)
    return comps, out


def layout_of(s) -> dict | None:
    """A Setting's sharding as a dict (kind, world_size, nodes, shard), checked; None for one device
    (the Setting refused ranks without a ``parallel`` already)."""
    if s.parallel is None:
        return None
    problems = layout_problems(s.parallel, 1, s.nodes) or ([f"parallel={s.parallel!r} over world_size=1 shards "
        "nothing: give world_size=N, the GPUs to shard over (tunekit plan: --world-size N), or leave parallel out "
        "for one GPU"] if s.parallel != "ddp" and s.world_size == 1 else [])   # hsdp: its nodes >= 2 said first
    if problems:
        raise ValueError("; ".join(problems))
    return dict(kind=s.parallel, world_size=s.world_size, nodes=s.nodes,
                shard=shard_count(s.parallel, s.world_size, s.nodes))
