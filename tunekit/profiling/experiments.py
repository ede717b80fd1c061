"""`tunekit.experiment(name)`: ipyexperiments' experiment container, usable everywhere.

ipyexperiments tracks the variables an experiment creates, deletes them at the end, collects
garbage and reports how much memory was consumed and reclaimed: a leak check. It assumes a
Jupyter kernel (`get_ipython().kernel.shell`) and prints its report. This bridge
- hands it the running IPython shell (kernel or terminal), or in a plain script a small shell
  over the caller's module globals (variables local to a function cannot be deleted from outside);
- reads GPU memory through tunekit.measure.nvml (CUDA_VISIBLE_DEVICES UUIDs included) and only uses the
  GPU backend when the process already initialized CUDA (no context is created for the check);
- keeps its printed report in `exp.report_text` and records the result in `tunekit.history()`.
"""
from __future__ import annotations

import contextlib
import io
import math
import os
import sys
import time

from tunekit.core.units import is_missing
from tunekit.measure import nvml
from tunekit.measure.device import cuda_device_index
from tunekit.measure.history import HISTORY
from tunekit.measure.meters import cpu_rss_bytes
from tunekit.measure.oom import malloc_trim
from tunekit.profiling.probe import Probe
from tunekit.view.frontend import shell, show


class _ScriptShell:
    """The slice of an IPython shell that ipyexperiments uses, over a plain dict namespace."""

    def __init__(self, namespace: dict):
        self.user_ns = namespace
        self.user_ns_hidden = {}

    def del_var(self, name, by_name=False):
        self.user_ns.pop(name, None)


def _import_ipyexperiments():
    # ipyexperiments sets CUDA_MODULE_LOADING=EAGER at import, which would silently change how
    # this whole process loads CUDA kernels: keep the user's setting.
    before = os.environ.get("CUDA_MODULE_LOADING")
    try:
        import ipyexperiments.ipyexperiments as mod
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "ipyexperiments":
            raise
        raise ModuleNotFoundError(
            "tunekit.experiment() needs ipyexperiments, the [experiments] extra: pip install "
            "'tunekit[experiments]' (or, without the deprecated pynvml package it requires: "
            "pip install --no-deps 'ipyexperiments>=0.1.29')", name="ipyexperiments") from None

    if before is None:
        os.environ.pop("CUDA_MODULE_LOADING", None)
    else:
        os.environ["CUDA_MODULE_LOADING"] = before
    return mod


def _backend(shell, gpu_index):
    mod = _import_ipyexperiments()
    base = mod.IPyExperimentsPytorch if gpu_index is not None else mod.IPyExperimentsCPU

    class Backend(base):
        def __init__(self):
            # IPyExperiments.__init__ finds the shell with its module-level get_ipython() and
            # reads `.kernel.shell`, which exists only in a Jupyter kernel. Rather than patch that
            # module global (process-wide, not thread-safe), we let the base class set up its
            # logger fields with the experiment disabled (it then touches no shell) and do its
            # remaining five assignments with the shell we have. tests/profiling/test_experiments.py has a
            # canary that fails if a release renames what we set here.
            super().__init__(exp_enable=False, cl_enable=False)  # its cell logger: ~100 ms a cell
            self.enable, self.reclaimed, self.var_names_keep = True, False, []
            self.start_time = time.time()
            self.namespace = mod.NamespaceMagics()
            self.namespace.shell = shell
            self.var_names_start = self.get_var_names()
            self.backend_init()
            self.start()

        def cpu_ram_used(self):
            # this process's RSS as it is now: ipyexperiments reads a psutil.Process made at its
            # import, whose pid is another process's in a child forked after that import. Freed
            # heap memory is handed back first (malloc_trim, ~ms): else an allocation that reuses
            # a hole in the heap is not consumed, and a freed one is not reclaimed, as RSS sees it
            malloc_trim()
            return cpu_rss_bytes()

        def gpu_ram(self):
            self.gpu_clear_cache()
            h = nvml.handle(self.gpu_current_device_id)
            if h is None:  # unknown, not zero: the record will show NaN
                return math.nan, math.nan, math.nan
            info = nvml.library().nvmlDeviceGetMemoryInfo(h)
            return info.total, info.free, info.used

    return Backend


class experiment:
    """Run a block as an experiment: new variables are freed at the end and leaks reported.

    >>> with tunekit.experiment("big batch") as exp:
    ...     x = torch.randn(4096, 4096)      # deleted when the block ends
    ...     exp.keep("result")              # names to keep
    ...     result = x.sum()
    >>> exp.record.exp_cpu_reclaimed_bytes
    """

    def __init__(self, name: str = "experiment", namespace: dict | None = None, quiet: bool = False,
                 probe: Probe | None = None):
        self.name, self.quiet = name, quiet
        self.probe = probe or Probe(name, key=f"experiment:{name}", flops="never")
        self._namespace = namespace if namespace is not None else sys._getframe(1).f_globals
        self.report_text = ""
        self.record = None
        self._keep: list[str] = []

    def keep(self, *names: str) -> None:
        """Variable names (strings) that survive the end of the experiment."""
        for n in names:
            if not isinstance(n, str):
                raise TypeError(f"keep() takes variable names as strings, got {type(n).__name__}")
        self._keep.extend(names)

    def _shell(self):
        ip = shell()
        if ip is not None and self._namespace is ip.user_ns:
            return ip
        return _ScriptShell(self._namespace)

    def __enter__(self) -> "experiment":
        self.gpu_index = cuda_device_index()
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            self._exp = _backend(self._shell(), self.gpu_index)()
        self.report_text = buf.getvalue()
        self.probe.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        rec = self.probe.record
        own = [k for k, v in list(self._namespace.items()) if v is self]  # `with ... as exp`
        self._exp.keep_var_names(*self._keep, *own)
        buf = io.StringIO()
        # measure first (time/memory of the block), then let ipyexperiments free and compare
        self.probe.history = None
        self.probe.stop(exc)
        with contextlib.redirect_stdout(buf):
            data = self._exp.finish()
        self.report_text += buf.getvalue()
        rec.exp_cpu_consumed_bytes = float(data.cpu.consumed)
        rec.exp_cpu_reclaimed_bytes = float(data.cpu.reclaimed)
        if self.gpu_index is not None:
            rec.exp_gpu_consumed_bytes = float(data.gpu.consumed)
            rec.exp_gpu_reclaimed_bytes = float(data.gpu.reclaimed)
            if is_missing(rec.exp_gpu_consumed_bytes):
                rec.notes.append(f"GPU leak check n/a: {nvml.unavailable_reason() or 'NVML unavailable'}")
        deleted = [ln for ln in self.report_text.splitlines() if ln.startswith("Deleted:")]
        if deleted:
            rec.notes.append(deleted[-1].replace("Deleted:", "freed variables:"))
        HISTORY.append(rec)
        self.record = rec
        if not self.quiet:
            _show(rec)
        return False


def _show(rec) -> None:
    from tunekit.core.summary import Summary

    show(Summary(rec))
