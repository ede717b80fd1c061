"""tunekit: measure and tune PyTorch training in Jupyter.

    %load_ext tunekit
    %%gpuprofile            # time, CPU/GPU memory, FLOPs, TFLOPS, MFU/HFU of a cell
    tunekit.history()       # every profiled cell as a DataFrame
    lab = tunekit.Lab()     # a live demo model; lab.run(precision="bf16"); lab.dashboard()

Importing tunekit is cheap: torch, pandas, plotly and ipywidgets load when first used.
Layout (docs/ARCHITECTURE.md): core/ (pure), measure/, models/, memory/, lab/, bench/, and the
UI modules magics, experiments, plots. Every module is also reachable as ``tunekit.<name>``.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

__version__ = "0.1.0"

# public name -> (module, attribute); resolved on first access (PEP 562)
_EXPORTS = {
    "profile": ("measure.probe", "profile"),
    "history": ("measure.probe", "history"),
    "last": ("measure.probe", "last"),
    "clear_history": ("measure.probe", "clear_history"),
    "ProfileRecord": ("core.records", "ProfileRecord"),
    "peak_tflops": ("measure.peaks", "peak_tflops"),
    "calibrate": ("measure.peaks", "calibrate"),
    "resolve_peak": ("measure.peaks", "resolve_peak"),
    "count_flops": ("measure.flops", "count_flops"),
    "time_repeats": ("measure.timing", "time_repeats"),
    "median_s": ("measure.timing", "median_s"),
    "time_records": ("measure.timing", "time_records"),
    "verdict": ("measure.timing", "verdict"),
    "Conditions": ("core.conditions", "Conditions"),
    "watch_conditions": ("measure.conditions", "watch"),
    "Verdict": ("measure.timing", "Verdict"),
    "conclude": ("core.conditions", "conclude"),
    "experiment": ("experiments", "experiment"),
    "plot_history": ("plots", "plot_history"),
    "plot_breakdown": ("trace_plots", "plot_breakdown"),
    "plot_memory_timeline": ("trace_plots", "plot_memory_timeline"),
    "show_summary": ("report_html", "show_summary"),
    "Lab": ("lab.lab", "Lab"),
    "RunResult": ("lab.runlog", "RunResult"),
    "Toggles": ("lab.toggles", "Toggles"),
    "repeat_agreement": ("lab.runlog", "repeat_agreement"),
    "AutotuneResult": ("lab.autotune", "AutotuneResult"),
    "GPT": ("models.gpt", "GPT"),
    "GPTConfig": ("models.gpt", "GPTConfig"),
    "estimate_memory": ("memory.estimate", "estimate_memory"),
    "measure_memory": ("memory.measure", "measure_memory"),
    "advise": ("core.advisor", "advise"),
}

# tunekit.<name> -> where the module lives: short names for every module, and the flat names
# of tunekit 0.1 (`tunekit.model`, `from tunekit.toggles import Toggles`) keep working.
_MODULES = {
    "units": "core.units", "formulas": "core.formulas", "specs": "core.specs",
    "records": "core.records", "summary": "core.summary", "report": "core.summary",
    "advisor": "core.advisor", "registry": "core.registry", "shapes": "core.shapes",
    "device": "measure.device", "meters": "measure.meters", "nvml": "measure.nvml",
    "flops": "measure.flops", "fingerprint": "measure.fingerprint", "peaks": "measure.peaks",
    "probe": "measure.probe", "timing": "measure.timing", "oom": "measure.oom",
    "torch_private": "measure.torch_private", "energy": "measure.energy", "trace": "measure.trace",
    "breakdown": "core.breakdown",
    "model": "models.gpt", "gpt": "models.gpt", "data": "models.data",
    "anatomy": "memory.estimate", "estimate": "memory.estimate",
    "anatomy_gpt": "memory.gpt_count", "gpt_count": "memory.gpt_count", "tally": "memory.tally",
    "toggles": "lab.toggles", "runlog": "lab.runlog", "maxbatch": "lab.maxbatch",
    "optimizers": "lab.optimizers", "lab_probe": "lab.step", "lab_plots": "lab.plots",
    "widgets": "lab.dashboard", "dashboard": "lab.dashboard",
}
_PACKAGES = {"core", "measure", "models", "memory", "lab", "bench", "magics", "experiments", "plots",
             "report_html", "trace_plots", "dist"}

__all__ = sorted(_EXPORTS) + ["load_ipython_extension", "unload_ipython_extension"]


class _ModuleAliases(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes ``import tunekit.toggles`` give the module ``tunekit.lab.toggles`` itself (one
    module object, not a copy), so old import paths keep working after the restructure."""

    def find_spec(self, fullname, path=None, target=None):
        head, _, name = fullname.partition(".")
        if head == __name__ and name in _MODULES:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def __init__(self):
        self._real_specs = {}

    def create_module(self, spec):
        module = importlib.import_module(f"{__name__}.{_MODULES[spec.name.partition('.')[2]]}")
        # the import system then sets module.__spec__ to the alias's spec: put the real one back
        self._real_specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module):
        module.__spec__ = self._real_specs.pop(module.__spec__.name)


if not any(isinstance(f, _ModuleAliases) for f in sys.meta_path):
    sys.meta_path.append(_ModuleAliases())


def _quiet_deprecated_pynvml_shim() -> None:
    # ipyexperiments depends on the deprecated `pynvml` distribution, whose import hook (loaded
    # at start-up by a .pth file) warns on the first `import pynvml`, i.e. inside `import torch`,
    # and so shows up as a warning box in notebooks. The bindings themselves come from
    # nvidia-ml-py, which tunekit depends on directly, so that warning is not actionable for our
    # users. We mark the hook as having warned; no warning filter is touched.
    # tests/test_imports.py checks this still works with the installed shim.
    hook = getattr(sys.modules.get("_pynvml_redirector"), "finder", None)
    if hook is not None and hasattr(hook, "has_warned_pynvml"):
        hook.has_warned_pynvml = True


_quiet_deprecated_pynvml_shim()

class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``then()`` right after module ``name`` is first imported, then steps aside. Here:
    tunekit picks plotly's renderer when plotly.io loads (``renderer.choose``: never a browser
    outside a kernel), so ``import tunekit`` itself loads no plotly."""

    def __init__(self, name, then):
        self.name, self.then = name, then

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # the real finders find the real spec
        spec = importlib.util.find_spec(fullname)
        if spec is None or isinstance(spec.loader, type) or not hasattr(spec.loader, "exec_module"):
            return spec  # no loader object of its own to wrap (a built-in, frozen or missing module)
        loader = spec.loader

        def exec_module(module):
            del loader.exec_module  # this loader object serves this one module: back to its own method
            loader.exec_module(module)
            self.then()

        loader.exec_module = exec_module
        return spec


def _choose_renderer():
    try:
        from .renderer import choose

        choose()
    except Exception as e:  # noqa: BLE001 - plotly must import whatever befalls tunekit's choice
        import warnings

        warnings.warn(f"tunekit: plotly's renderer left as plotly chose it ({type(e).__name__}: {e})",
                      stacklevel=2)


if "plotly.io" in sys.modules:
    _choose_renderer()
elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _AfterImport("plotly.io", _choose_renderer))


def __getattr__(name):
    if name in _EXPORTS:
        module, attr = _EXPORTS[name]
        value = getattr(importlib.import_module(f".{module}", __name__), attr)
        globals()[name] = value
        return value
    if name in _MODULES or name in _PACKAGES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'tunekit' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS) | set(_MODULES) | _PACKAGES)


def load_ipython_extension(ip):
    """``%load_ext tunekit``"""
    from .magics import load_ipython_extension as load

    load(ip)


def unload_ipython_extension(ip):
    """``%unload_ext tunekit``"""
    from .magics import unload_ipython_extension as unload

    unload(ip)
