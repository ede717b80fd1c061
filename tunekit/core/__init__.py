"""The pure core: formulas, device specs, units, the registry of optimizers/dtypes/attention,
shape arithmetic, profile records and their text summaries, the sizing advisor.

Nothing here imports torch or IPython (tests/project/test_layers.py enforces it), so every function can
be tested with plain numbers.
"""
from tunekit.core.extras import needs_extra

__all__ = ["needs_extra"]
