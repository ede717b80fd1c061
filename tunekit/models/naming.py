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


def blocks_example(model) -> str:
    """How to name ``model``'s blocks to a Lab, from its own modules: its first module lists
    (``blocks='features'``, an nn.ModuleList or nn.Sequential below the root, at most three
    named), else its children as a list (``blocks=[model.c1, model.c2, ...]``)."""
    import torch

    model = getattr(model, "_orig_mod", model)
    lists = [n for n, m in model.named_modules() if n and isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential))]
    if lists:
        return f"Lab(model, blocks={lists[0]!r}) (its module lists: {', '.join(lists[:3])})"
    children = [n for n, _ in model.named_children()]
    if children:
        first = f"model[{children[0]}]" if children[0].isdigit() else f"model.{children[0]}"   # an nn.Sequential's
        return (f"Lab(model, blocks=[{first}, ...]) with the modules to recompute "
                f"(its children: {', '.join(children)})")
    return "Lab(model, blocks=[...]) with the modules to recompute"
