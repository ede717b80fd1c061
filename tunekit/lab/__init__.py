"""The Lab: a live model trained under toggles, its run log, the max-batch search, and its
plots and dashboard.

    >>> from tunekit.lab import Lab
    >>> lab = Lab(); lab.run(steps=20, precision="bf16"); lab.dashboard()

Modules: `lab` (the Lab), `toggles` (the rules; pure), `runlog` (RunResult and the JSONL log;
pure), `step` (the untimed FLOP/activation probe), `optimizers`, `maxbatch`, `autotune`, `plots`,
`autotune_view`, `dashboard`, `fit` (refuses a step that cannot fit in the memory available).
"""
import importlib

_EXPORTS = {"Lab": "lab", "RunResult": "runlog", "results_frame": "runlog", "Toggles": "toggles",
            "ToggleError": "toggles", "find_max_batch_size": "maxbatch", "Dashboard": "dashboard",
            "AutotuneResult": "autotune", "WontFitError": "fit"}


def __getattr__(name):  # lazy: `tunekit.lab.toggles` is pure and must not pull in torch
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'tunekit.lab' has no attribute {name!r}")
