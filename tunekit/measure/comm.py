"""Count the collectives a rank issues, and their bytes, by kind and by scope. Measurement.

    >>> counter = CommCounter(node_of=lambda rank: rank // 2)
    >>> with counter:
    ...     train_step()
    >>> counter.table()      # {"all_gather/intra": {"count": 6, "bytes": 1713408}, ...}

DDP's reducer, FSDP2 and torch.distributed's own functions all issue their collectives as
``c10d`` ops on torch's dispatcher, so one dispatch mode sees them all, whoever issues them and
on whichever thread autograd runs the backward. Sizes follow tunekit.core.comm: an all-gather
counts its gathered output, a reduce-scatter its unreduced input, an all-reduce and a broadcast
their buffer. The scope is "inter" when the group's ranks sit on more than one node.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from tunekit.measure.torch_private import dispatch_mode_class, unbox_process_group

# c10d op name -> (kind, which argument holds the sized tensor(s))
_OPS = {
    "allreduce_": ("all_reduce", 0), "allreduce_coalesced_": ("all_reduce", 0),
    "_allgather_base_": ("all_gather", 0), "allgather_": ("all_gather", 0),
    "allgather_into_tensor_coalesced_": ("all_gather", 0), "allgather_coalesced_": ("all_gather", 0),
    "_reduce_scatter_base_": ("reduce_scatter", 1), "reduce_scatter_": ("reduce_scatter", 1),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1),
    "broadcast_": ("broadcast", 0),
}


def _nbytes(arg) -> int:
    if isinstance(arg, torch.Tensor):
        return arg.numel() * arg.element_size()
    if isinstance(arg, (list, tuple)):
        return sum(_nbytes(a) for a in arg)
    return 0


_SEEN: dict = {}  # op overload -> False (not a collective) or (name, kind or None, sized arg)


def _classify(func):
    if func.namespace != "c10d":
        return False
    name = func.__name__.split(".")[0]
    kind, pos = _OPS.get(name, (None, None))
    return name, kind, pos


class CommCounter(dispatch_mode_class()):
    """A dispatch mode that tallies c10d collectives; ``table()`` reads the tally,
    ``reset()`` clears it (between steps). ``node_of(rank)`` says which node a global rank is
    on. Ops it does not know (send/recv, barrier...) are counted by name in ``other``."""

    def __init__(self, node_of=lambda rank: 0):
        super().__init__()
        self.node_of = node_of
        self._scopes: dict = {}   # process group name -> "intra" | "inter"
        self.reset()

    def reset(self) -> None:
        self.counts: dict = {}
        self.other: dict = {}

    def _scope(self, group_arg) -> str:
        pg = unbox_process_group(group_arg)
        key = pg.group_name
        if key not in self._scopes:
            nodes = {self.node_of(r) for r in dist.get_process_group_ranks(pg)}
            self._scopes[key] = "inter" if len(nodes) > 1 else "intra"
        return self._scopes[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # the hot path: every op of the step passes here; one dict lookup for all but c10d ops
        known = _SEEN.get(func)
        if known is None:
            known = _SEEN[func] = _classify(func)
        if known is not False:
            self._count(known, args)
        return func(*args, **kwargs) if kwargs else func(*args)

    def _count(self, known, args) -> None:
        name, kind, pos = known
        if kind is None:
            self.other[name] = self.other.get(name, 0) + 1
            return
        group = next(a for a in args if isinstance(a, torch.ScriptObject)
                     and "ProcessGroup" in str(a._type()))
        entry = self.counts.setdefault(f"{kind}/{self._scope(group)}", [0, 0])
        entry[0] += 1
        entry[1] += _nbytes(args[pos])

    def table(self) -> dict:
        """``{"kind/scope": {"count": n, "bytes": b}}`` since the last reset."""
        return {k: {"count": c, "bytes": b} for k, (c, b) in sorted(self.counts.items())}
