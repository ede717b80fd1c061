"""tunekit: measure and tune PyTorch training in Jupyter.

    %load_ext tunekit
    %%gpuprofile            # time, CPU/GPU memory, FLOPs, TFLOPS, MFU/HFU of a cell
    tunekit.history()       # every profiled cell as a DataFrame
    lab = tunekit.Lab()     # a live demo model; lab.run(precision="bf16"); lab.dashboard()

Importing tunekit is cheap and changes nothing: torch, pandas, plotly and ipywidgets load when a
name below is first used. Layout, one layer per folder (docs/ARCHITECTURE.md): core/ (pure),
models/, measure/, engine/, ui/.
"""
from __future__ import annotations

import importlib

__version__ = "0.2.0"

# public name -> (module, attribute); resolved on first access (PEP 562)
_EXPORTS = {
    "profile": ("measure.profile", "profile"),
    "history": ("measure.history", "history"),
    "last": ("measure.history", "last"),
    "clear_history": ("measure.history", "clear_history"),
    "ProfileRecord": ("core.records", "ProfileRecord"),
    "peak_tflops": ("measure.peaks", "peak_tflops"),
    "calibrate": ("measure.peaks", "calibrate"),
    "resolve_peak": ("measure.peaks", "resolve_peak"),
    "count_flops": ("measure.flops", "count_flops"),
    "time_repeats": ("measure.timing", "time_repeats"),
    "median_s": ("measure.timing", "median_s"),
    "time_records": ("measure.timing", "time_records"),
    "verdict": ("measure.timing", "verdict"),
    "Verdict": ("measure.timing", "Verdict"),
    "Conditions": ("core.conditions", "Conditions"),
    "watch_conditions": ("measure.conditions", "watch"),
    "conclude": ("core.conditions", "conclude"),
    "experiment": ("ui.experiments", "experiment"),
    "plot_history": ("ui.plots", "plot_history"),
    "plot_breakdown": ("ui.trace_plots", "plot_breakdown"),
    "plot_memory_timeline": ("ui.trace_plots", "plot_memory_timeline"),
    "plot_plan": ("ui.plan_plots", "plot_plan"),
    "show_summary": ("ui.report_html", "show_summary"),
    "use_renderer": ("ui.renderer", "use_renderer"),
    "Lab": ("engine.lab", "Lab"),
    "Monitor": ("engine.monitor.monitor", "Monitor"),
    "RunResult": ("core.results", "RunResult"),
    "Toggles": ("core.toggles", "Toggles"),
    "ToggleError": ("core.toggles", "ToggleError"),
    "repeat_agreement": ("core.runlog", "repeat_agreement"),
    "AutotuneResult": ("engine.autotune", "AutotuneResult"),
    "find_max_batch_size": ("engine.maxbatch", "find_max_batch_size"),
    "WontFitError": ("engine.fit", "WontFitError"),
    "GPT": ("models.gpt", "GPT"),
    "GPTConfig": ("models.gpt", "GPTConfig"),
    "estimate_memory": ("core.memory.estimate", "estimate_memory"),
    "measure_memory": ("measure.memory", "measure_memory"),
    "advise": ("core.advisor", "advise"),
    "plan": ("engine.plan", "plan"),
    "Plan": ("core.plan", "Plan"),
    "Setting": ("core.setting", "Setting"),
}
# public namespaces: `from tunekit import bench` (the documents' microbenchmarks and bench.plot)
_NAMESPACES = {"bench": "ui.bench"}
_LAYERS = ("core", "models", "measure", "engine", "ui", "integrations")

__all__ = sorted(_EXPORTS) + sorted(_NAMESPACES) + ["load_ipython_extension", "unload_ipython_extension"]


def __getattr__(name):
    if name in _EXPORTS:
        module, attr = _EXPORTS[name]
        value = getattr(importlib.import_module(f".{module}", __name__), attr)
    elif name in _NAMESPACES:
        value = importlib.import_module(f".{_NAMESPACES[name]}", __name__)
    elif name in _LAYERS:
        return importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module 'tunekit' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS) | set(_NAMESPACES) | set(_LAYERS))


def load_ipython_extension(ip):
    """``%load_ext tunekit``: the %%gpuprofile magic and tunekit's plotly renderer."""
    from .ui.magics import load_ipython_extension as load

    load(ip)


def unload_ipython_extension(ip):
    """``%unload_ext tunekit``: both removed, plotly's renderer as it was before."""
    from .ui.magics import unload_ipython_extension as unload

    unload(ip)
