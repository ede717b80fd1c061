"""What every answer to "how much memory does one training step take?" is: bytes by component,
named the same way, and the method that found them. Pure: no torch.

Three answers, one vocabulary (`MemoryAnswer`):

- ``tunekit.estimate_memory``: ``method="analytic"``, formulas from sizes alone, instant, for the
  model families tunekit knows (`MemoryEstimate`);
- ``tunekit.plan``: ``method="fake step"``, the training step run under fake tensors, any model,
  any device (`Plan`; ``"analytic"`` where the fake step could not run);
- ``tunekit.measure_memory``: ``method="measured"``, a real step on this machine (`MemoryReport`).

Each answer's ``total_bytes`` is the step's peak as its method sees it: the estimate adds its
lines up, the plan takes the peak of the live bytes over the fake step plus the fixed costs, and the
measurement reads the peak (the allocator's on CUDA, the named components' sum on the CPU).
"""
from __future__ import annotations

import math

from tunekit.core.units import is_missing

# every component any answer may name, in the order they are shown
COMPONENTS = ("weights", "master_weights", "gradients", "optimizer_states", "buffers", "weight_casts",
              "activations", "recompute", "temporary", "cuda_context", "distributed")
# what a step holds whatever its batch: the model's states
STATIC = ("weights", "master_weights", "gradients", "optimizer_states")
METHODS = ("analytic", "fake step", "measured")


class MemoryAnswer:
    """The shared part of the three memory answers: ``components`` (name -> bytes; NaN where the
    method cannot tell, never a silent 0), ``method`` (one of `METHODS`) and ``notes``.

    >>> a = tunekit.estimate_memory(cfg, micro_batch=2, seq_len=64)
    >>> isinstance(a, MemoryAnswer), a.method, a["weights"], a.static_bytes
    """

    components: dict
    method: str
    notes: list

    def __getitem__(self, name: str) -> float:
        return self.components[name]

    @property
    def static_bytes(self) -> float:
        """Weights + master copy + gradients + optimizer states (the known ones)."""
        return sum(v for k, v in self.components.items() if k in STATIC and not is_missing(v))

    @property
    def unknown(self) -> list:
        """The components this method could not count (NaN): totals leave them out, and say so."""
        return [k for k, v in self.components.items() if is_missing(v)]

    @property
    def known_bytes(self) -> float:
        """The sum of the components that were counted."""
        return math.fsum(v for v in self.components.values() if not is_missing(v))
