"""Memory anatomy of training: `estimate` (from sizes alone; pure), `gpt_count` (the demo GPT
tensor by tensor; pure), `tally` (bytes autograd saves) and `measure` (one measured step).

    >>> from tunekit.memory import estimate_memory, measure_memory
"""
import importlib

_EXPORTS = {"estimate_memory": "estimate", "MemoryEstimate": "estimate",
            "measure_memory": "measure", "MemoryReport": "measure",
            "SavedTensorTally": "tally", "unique_bytes": "tally", "storage_key": "tally"}


def __getattr__(name):  # lazy: the estimate is pure and must not pull in torch
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'tunekit.memory' has no attribute {name!r}")
