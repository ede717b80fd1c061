"""This CPU's rate of the random numbers dropout draws, measured: CPU's ``F.dropout`` in training
fills a noise tensor of its input's shape and dtype with ``bernoulli_(1 - p)`` (then ``div_`` and a
``mul``), and that fill is compute-bound (a random number per element: about 6 ns an element on a
2-core VM, some 40x a multiply's), not memory-bound like the ``div_`` and ``mul`` around it. A plan
that costs it at the streaming bandwidth misses most of a dropout's time, and more as the sequence
grows: attention's dropout runs on the [batch, heads, seq, seq] weights. Measurement layer.

The figure: elements per second of ``bernoulli_`` on a tensor of 2^18 elements (a seq-128 attention's
weights at batch 4 x 4 heads), per dtype, the fastest of repeated trials (measure.trials); measured
once per machine, torch and thread count (the cache key), cached as JSON beside the stream's
figures (measure.stream), whatever the load it was taken under (its ``conditions`` say)."""
from __future__ import annotations

import time

from tunekit.core import paths
from tunekit.core.registry import BF16, FP32
from tunekit.measure.trials import best_s

VERSION = 1
ELEMENTS = 2**18
DTYPES = (FP32, BF16)



def _key(name: str) -> str:
    import torch

    return f"{name}|torch {torch.__version__}|{torch.get_num_threads()} threads|v{VERSION}"


def _load() -> dict:
    return paths.read_cache("rng.json")


def _save(data: dict) -> None:
    paths.write_cache("rng.json", data)


def bernoulli_rate(dtype, elements: int = ELEMENTS) -> float:
    """Elements per second of ``bernoulli_(0.9)`` on a tensor of ``elements`` of ``dtype``: its fastest trial."""
    import torch

    noise = torch.empty(elements, dtype=dtype)
    return elements / best_s(lambda: noise.bernoulli_(0.9))


def measure_rng(refresh: bool = False) -> dict:
    """{"rates": {dtype name: elements/s of bernoulli_}, "verdict": "quiet" or "busy", ...}: from the
    cache when it holds this machine's, torch's and thread count's, else measured once and cached.
    ``refresh=True`` measures again (say at a quiet moment, after a busy first measurement)."""
    import torch

    from tunekit.core import registry
    from tunekit.measure.conditions import ConditionsMeter
    from tunekit.measure.peaks import device_name

    key = _key(device_name("cpu"))
    cache = _load()
    if key in cache and not refresh and isinstance(cache[key].get("rates"), dict):
        return cache[key]
    meter = ConditionsMeter().start()
    t0 = time.perf_counter()
    rates = {d: bernoulli_rate(getattr(torch, registry.dtype(d).torch_name)) for d in DTYPES}
    cond = meter.stop(time.perf_counter() - t0)
    entry = {"rates": rates, "elements": ELEMENTS, "taken_at": time.time(),
             "verdict": cond.verdict if cond is not None else "unknown"}
    cache[key] = entry
    _save(cache)
    return entry
