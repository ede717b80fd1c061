"""Profiling a cell or a block: ``%%gpuprofile`` and ``%gpuprofile on`` (`magics`),
``tunekit.profile`` (`block`), the `Probe` both run (`probe`), whether a block's inputs changed
since its FLOPs were counted (`fingerprint`), ``tunekit.experiment`` (`experiments`) and the
charts of profiled cells (`plots`).
"""
from tunekit.profiling.plots import plot_history

__all__ = ["plot_history"]
