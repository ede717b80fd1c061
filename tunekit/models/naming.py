"""A model's name as tunekit shows it (a Lab's summary, its runs' ``model``): the class of the
module it trains, through torch.compile's and DDP's wrappers, said as such.

    >>> model_label(torch.compile(Net()))
    'Net (compiled)'
"""
from __future__ import annotations

_WRAPPERS = {"DistributedDataParallel": "DDP", "DataParallel": "DataParallel"}


def model_label(model) -> str:
    """``type(model).__name__``, or the wrapped module's with what wraps it: 'Net (compiled)' for
    ``torch.compile(Net())`` (an OptimizedModule), 'Net (DDP, compiled)' for a compiled DDP model."""
    said = []
    while True:
        if hasattr(model, "_orig_mod"):   # torch.compile's OptimizedModule
            said.append("compiled")
            model = model._orig_mod
        elif type(model).__name__ in _WRAPPERS and hasattr(model, "module"):
            said.append(_WRAPPERS[type(model).__name__])
            model = model.module
        else:
            break
    return type(model).__name__ + (f" ({', '.join(said)})" if said else "")


__all__ = ["model_label"]
