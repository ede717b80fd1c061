"""The options of a `Monitor`, checked before any step (also by the callbacks that make one, when
they are built)."""
from __future__ import annotations

from tunekit.core import registry, validate

DTYPES = tuple(registry.PRECISIONS)   # the dtypes a peak can be taken for: those a training step computes in


def check_options(name=None, tokens=None, samples=None, flops="auto", model_flops=None, peak=None,
                  dtype=None, warmup=1, total=None, live=None, trace=None) -> dict:
    """The options, checked and normalized (ints as int, numbers as float); a ValueError names
    the first bad one. Example: ``check_options(warmup=2, peak=989.0)``."""
    return dict(
        name=None if name is None else validate.text("name", name),
        tokens=None if tokens is None else validate.count("tokens", tokens),
        samples=None if samples is None else validate.count("samples", samples),
        flops=validate.choice("flops", flops, ("auto", "never")),
        model_flops=None if model_flops is None else validate.real("model_flops", model_flops),
        peak=None if peak is None else validate.real("peak", peak),
        dtype=None if dtype is None else validate.choice("dtype", dtype, DTYPES),
        warmup=validate.whole("warmup", warmup, minimum=0),
        total=None if total is None else validate.count("total", total),
        live=None if live is None else validate.flag("live", live),
        trace=None if trace is None else validate.whole("trace", trace, minimum=0))
