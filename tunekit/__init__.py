"""tunekit: measure and tune PyTorch training in Jupyter.

    %load_ext tunekit
    %%gpuprofile            # time, CPU/GPU memory, FLOPs, TFLOPS, MFU/HFU of a cell
    tunekit.history()       # every profiled cell as a DataFrame
    lab = tunekit.Lab()     # a live demo model; lab.run(precision="bf16"); lab.dashboard()

Importing tunekit is cheap and changes nothing: torch, pandas, plotly and ipywidgets load when a
name below is first used. Layout (docs/ARCHITECTURE.md): shared layers core/ (pure), models/,
measure/, train/, view/, and a folder per product over them: profiling/, planning/, monitor/,
parallel/, autotune/, bench/, lab/, integrations/, cli/.
"""
from __future__ import annotations

import importlib

__version__ = "0.2.0"

# public name -> (module, attribute); resolved on first access (PEP 562)
_EXPORTS = {
    "profile": ("profiling.block", "profile"),
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
    "experiment": ("profiling.experiments", "experiment"),
    "plot_history": ("profiling.plots", "plot_history"),
    "plot_breakdown": ("view.trace_plots", "plot_breakdown"),
    "plot_memory_timeline": ("view.trace_plots", "plot_memory_timeline"),
    "plot_plan": ("planning.plots", "plot_plan"),
    "show_summary": ("cli.report_html", "show_summary"),
    "use_renderer": ("view.renderer", "use_renderer"),
    "Lab": ("lab.lab", "Lab"),
    "Monitor": ("monitor.monitor", "Monitor"),
    "RunResult": ("core.results", "RunResult"),
    "Toggles": ("core.toggles", "Toggles"),
    "ToggleError": ("core.toggles", "ToggleError"),
    "repeat_agreement": ("lab.runlog", "repeat_agreement"),
    "AutotuneResult": ("autotune", "AutotuneResult"),
    "find_max_batch_size": ("lab.maxbatch", "find_max_batch_size"),
    "WontFitError": ("lab.fit", "WontFitError"),
    "GPT": ("models.gpt", "GPT"),
    "GPTConfig": ("models.gpt", "GPTConfig"),
    "estimate_memory": ("core.memory.estimate", "estimate_memory"),
    "measure_memory": ("measure.memory", "measure_memory"),
    "MemoryAnswer": ("core.memory.answer", "MemoryAnswer"),
    "advise": ("core.advisor", "advise"),
    "diff": ("core.diff", "diff"),
    "explain": ("core.explain", "explain"),
    "plan": ("planning.planner", "plan"),
    "Plan": ("planning.record", "Plan"),
    "Setting": ("core.setting", "Setting"),
    "needs_extra": ("core.extras", "needs_extra"),
}
# public namespaces: `from tunekit import bench` (the documents' microbenchmarks and bench.plot)
_NAMESPACES = {"bench": "bench"}
_FOLDERS = ("core", "models", "measure", "train", "view", "profiling", "planning", "monitor", "parallel",
            "autotune", "bench", "lab", "integrations", "cli")

__all__ = sorted(_EXPORTS) + sorted(_NAMESPACES) + ["load_ipython_extension", "unload_ipython_extension"]


def __getattr__(name):
    if name in _EXPORTS:
        module, attr = _EXPORTS[name]
        value = getattr(importlib.import_module(f".{module}", __name__), attr)
    elif name in _NAMESPACES:
        value = importlib.import_module(f".{_NAMESPACES[name]}", __name__)
    elif name in _FOLDERS:
        return importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module 'tunekit' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS) | set(_NAMESPACES) | set(_FOLDERS))


def load_ipython_extension(ip):
    """``%load_ext tunekit``: the %%gpuprofile magic and tunekit's plotly renderer."""
    from tunekit.profiling.magics import load_ipython_extension as load

    load(ip)


def unload_ipython_extension(ip):
    """``%unload_ext tunekit``: both removed, plotly's renderer as it was before."""
    from tunekit.profiling.magics import unload_ipython_extension as unload

    unload(ip)
