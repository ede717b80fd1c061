"""The parameter shapes of each FSDP unit as tunekit wraps a model: what a sharded step's planner
and every rank's worker divide. Models layer."""
from __future__ import annotations

import torch


def fsdp_units(model: torch.nn.Module, adapter, parallel: str) -> list:
    """Parameter shapes per fully_shard unit as tunekit wraps a model (each of the adapter's
    blocks, then the root's own parameters); for DDP one unit with every parameter. A tied
    weight counts once, in the first unit holding it; frozen parameters are left out."""
    seen, units = set(), []
    groups = [list(b.parameters()) for b in adapter.blocks()] if parallel != "ddp" else []
    for params in groups + [list(model.parameters())]:
        unit = []
        for p in params:
            if id(p) not in seen and p.requires_grad:
                seen.add(id(p))
                unit.append(tuple(p.shape))
        units.append(unit)
    return units
