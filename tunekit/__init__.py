"""tunekit: measure and tune PyTorch training in Jupyter.

    %load_ext tunekit
    %%gpuprofile            # time, CPU/GPU memory, FLOPs, TFLOPS, MFU/HFU of a cell
    tunekit.history()       # every profiled cell as a DataFrame
    lab = tunekit.Lab()     # a live demo model; lab.run(precision="bf16"); lab.dashboard()

The top-level names, by product (each resolves on first use; `help(tunekit.NAME)` says more):

Profile a cell or a block
    load_ipython_extension    ``%load_ext tunekit``: the %%gpuprofile magic and tunekit's renderer
    unload_ipython_extension  ``%unload_ext tunekit``: both removed
    profile                   ``with tunekit.profile(name=...) as rec:`` the magic's measurement, outside IPython
    history                   every profiled cell or block as a pandas DataFrame
    last                      the latest record
    clear_history             forget every record and every cached FLOP count
    ProfileRecord             one profiled cell or block (a dataclass)
    experiment                a block whose variables are freed at its end, with what it leaked

Peaks, FLOPs and verdicts
    peak_tflops               the spec sheet's dense peak of a device, or None
    calibrate                 the measured max achievable matmul TFLOPS (MAMF)
    count_flops               the FLOPs one call executes
    verdict                   faster, slower or within noise, from repeated timings

The Lab and its runs
    Lab                       a live model trained under toggles you flip; lab.dashboard()
    RunResult                 one lab.run: its toggles and what was measured
    Slurm                     a cluster target: lab.run(..., on=tunekit.Slurm(...)), plan.sbatch(...)
    explain                   a measured run against its expectation, op by op, in words
    diff                      what changed between two runs
    GPT                       tunekit's demo decoder-only transformer
    GPTConfig                 the demo GPT's shape

Plan a step
    Setting                   one training step described completely (frozen)
    plan                      one step under fake tensors on any device: memory, fit, bound
    Plan                      what plan returns
    estimate_memory           the analytic memory breakdown of a training step
    measure_memory            the same breakdown measured on this machine
    advise                    sizing recommendations for a model config

Your own loop
    Monitor                   per-step figures inside your own training loop

Microbenchmarks and display
    bench                     the documents' microbenchmarks (a namespace)
    use_renderer              which plotly renderer shows tunekit's figures

Everything else lives in its product's module: ``tunekit.measure`` (timing, conditions),
``tunekit.lab`` (toggles, run log), ``tunekit.planning``, ``tunekit.profiling``, ``tunekit.view``,
``tunekit.autotune``, ``tunekit.integrations`` (the trainer callbacks). Names that left the top
level after 0.2 (``MOVED``) still resolve there with a DeprecationWarning naming their new home.

Importing tunekit is cheap and changes nothing: torch, pandas, plotly and ipywidgets load when a
name is first used. Layout (docs/ARCHITECTURE.md): shared layers core/ (pure), models/,
measure/, train/, view/, and a folder per product over them: profiling/, planning/, monitor/,
parallel/, autotune/, bench/, lab/, integrations/, cli/.
"""
from __future__ import annotations

import importlib
import sys
import warnings

__version__ = "0.2.0"

# public name -> (module, attribute); resolved on first access (PEP 562). Grouped as __doc__ is.
_EXPORTS = {
    # profile a cell or a block
    "profile": ("profiling.block", "profile"),
    "history": ("measure.history", "history"),
    "last": ("measure.history", "last"),
    "clear_history": ("measure.history", "clear_history"),
    "ProfileRecord": ("core.records", "ProfileRecord"),
    "experiment": ("profiling.experiments", "experiment"),
    # peaks, FLOPs and verdicts
    "peak_tflops": ("measure.peaks", "peak_tflops"),
    "calibrate": ("measure.peaks", "calibrate"),
    "count_flops": ("measure.flops", "count_flops"),
    "verdict": ("measure.timing", "verdict"),
    # the Lab and its runs
    "Lab": ("lab.lab", "Lab"),
    "RunResult": ("core.results", "RunResult"),
    "Slurm": ("parallel.slurm", "Slurm"),
    "explain": ("core.explain", "explain"),
    "diff": ("core.diff", "diff"),
    "GPT": ("models.gpt", "GPT"),
    "GPTConfig": ("models.gpt", "GPTConfig"),
    # plan a step
    "Setting": ("core.setting", "Setting"),
    "plan": ("planning.planner", "plan"),
    "Plan": ("planning.record", "Plan"),
    "estimate_memory": ("core.memory.estimate", "estimate_memory"),
    "measure_memory": ("measure.memory", "measure_memory"),
    "advise": ("core.advisor", "advise"),
    # your own loop
    "Monitor": ("monitor.monitor", "Monitor"),
    # display
    "use_renderer": ("view.renderer", "use_renderer"),
}
# public namespaces: `from tunekit import bench` (the documents' microbenchmarks and bench.plot)
_NAMESPACES = {"bench": "bench"}
# names that left the top level after 0.2 -> their home (a module that re-exports them); each still
# resolves here for one release, with a DeprecationWarning naming the home
MOVED = {
    "median_s": "tunekit.measure", "time_repeats": "tunekit.measure", "time_records": "tunekit.measure",
    "Verdict": "tunekit.measure", "conclude": "tunekit.measure", "Conditions": "tunekit.measure",
    "watch_conditions": "tunekit.measure", "resolve_peak": "tunekit.measure",
    "plot_history": "tunekit.profiling", "show_summary": "tunekit.cli",
    "plot_breakdown": "tunekit.view", "plot_memory_timeline": "tunekit.view",
    "Toggles": "tunekit.lab", "ToggleError": "tunekit.lab", "repeat_agreement": "tunekit.lab",
    "find_max_batch_size": "tunekit.lab.maxbatch", "WontFitError": "tunekit.lab.fit",
    "AutotuneResult": "tunekit.autotune",
    "plot_plan": "tunekit.planning", "MemoryAnswer": "tunekit.planning",
    "needs_extra": "tunekit.core",
}
_FOLDERS = ("core", "models", "measure", "train", "view", "profiling", "planning", "monitor", "parallel",
            "autotune", "bench", "lab", "integrations", "cli")

__all__ = [
    # profile a cell or a block
    "load_ipython_extension", "unload_ipython_extension", "profile", "history", "last", "clear_history",
    "ProfileRecord", "experiment",
    # peaks, FLOPs and verdicts
    "peak_tflops", "calibrate", "count_flops", "verdict",
    # the Lab and its runs
    "Lab", "RunResult", "Slurm", "explain", "diff", "GPT", "GPTConfig",
    # plan a step
    "Setting", "plan", "Plan", "estimate_memory", "measure_memory", "advise",
    # your own loop
    "Monitor",
    # microbenchmarks and display
    "bench", "use_renderer",
]


def __getattr__(name):
    if name in _EXPORTS:
        module, attr = _EXPORTS[name]
        value = getattr(importlib.import_module(f".{module}", __name__), attr)
    elif name in _NAMESPACES:
        value = importlib.import_module(f".{_NAMESPACES[name]}", __name__)
    elif name in _FOLDERS:
        return importlib.import_module(f".{name}", __name__)
    elif name in MOVED:
        # not cached in globals(): every caller's line is told, once each (the warnings filter).
        # `from tunekit import NAME` reads the name twice: importlib's hasattr probe
        # (_handle_fromlist), then the statement's own read; only the second warns
        caller = sys._getframe(1).f_code
        if not (caller.co_name == "_handle_fromlist" and caller.co_filename.startswith("<frozen importlib")):
            warnings.warn(f"tunekit.{name} moved to {MOVED[name]}.{name}; the top-level name goes in the "
                          "next release", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(MOVED[name]), name)
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
