"""tunekit: measure and tune PyTorch training in Jupyter.

    %load_ext tunekit
    %%gpuprofile            # time, CPU/GPU memory, FLOPs, TFLOPS, MFU/HFU of a cell
    tunekit.history()       # every profiled cell as a DataFrame
    lab = tunekit.Lab()     # a live demo model; lab.run(precision="bf16"); lab.dashboard()

Importing tunekit is cheap: torch, pandas, plotly and ipywidgets load when first used.
"""
from __future__ import annotations

import importlib
import warnings

__version__ = "0.1.0"

# torch.cuda imports the deprecated `pynvml` shim that ipyexperiments depends on; the real
# bindings (nvidia-ml-py) are what tunekit uses, so that warning is noise for our users.
warnings.filterwarnings("ignore", message="The pynvml package is deprecated", category=FutureWarning)

# public name -> (module, attribute); resolved on first access (PEP 562)
_EXPORTS = {
    "profile": ("probe", "profile"),
    "history": ("probe", "history"),
    "last": ("probe", "last"),
    "clear_history": ("probe", "clear_history"),
    "ProfileRecord": ("records", "ProfileRecord"),
    "peak_tflops": ("peaks", "peak_tflops"),
    "calibrate": ("peaks", "calibrate"),
    "resolve_peak": ("peaks", "resolve_peak"),
    "count_flops": ("flops", "count_flops"),
    "experiment": ("experiments", "experiment"),
    "plot_history": ("plots", "plot_history"),
    "Lab": ("lab", "Lab"),
    "RunResult": ("lab", "RunResult"),
    "GPT": ("model", "GPT"),
    "GPTConfig": ("model", "GPTConfig"),
    "estimate_memory": ("anatomy", "estimate_memory"),
    "measure_memory": ("memory", "measure_memory"),
    "advise": ("advisor", "advise"),
}
_SUBMODULES = {"bench", "formulas", "specs", "units", "model", "data", "lab", "widgets", "anatomy",
               "memory", "advisor", "flops", "peaks", "probe", "records", "report", "meters", "nvml",
               "magics", "plots", "experiments"}

__all__ = sorted(_EXPORTS) + ["load_ipython_extension", "unload_ipython_extension"]


def __getattr__(name):
    if name in _EXPORTS:
        module, attr = _EXPORTS[name]
        value = getattr(importlib.import_module(f".{module}", __name__), attr)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'tunekit' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS) | _SUBMODULES)


def load_ipython_extension(ip):
    """``%load_ext tunekit``"""
    from .magics import load_ipython_extension as load

    load(ip)


def unload_ipython_extension(ip):
    """``%unload_ext tunekit``"""
    from .magics import unload_ipython_extension as unload

    unload(ip)
