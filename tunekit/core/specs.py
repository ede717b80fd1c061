"""Reading the GPU table (core.gpus, one `GPU` row per card, each figure with its source): the row
for a device name, its dense spec-sheet peak, what it trains instead of a dtype it has no peak for.
Pure, no torch.
"""
from __future__ import annotations

from tunekit.core import gpus
from tunekit.core.gpu import GPU
from tunekit.core.registry import DTYPES


def __getattr__(name):
    # SPECS: the rows as they are now (a test may add one), under the name the spec table had
    if name == "SPECS":
        return gpus.GPUS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def gpu(name: str) -> GPU:
    """The row named ``name`` exactly (a plan's device, once `find_spec` has read it)."""
    found = next((g for g in gpus.GPUS if g.name == name), None)
    if found is None:
        raise ValueError(f"no GPU row named {name!r}: one of {', '.join(names())}")
    return found


def rows() -> tuple:
    """The GPU rows, in the table's order (`core.gpus.GPUS` as it is now)."""
    return gpus.GPUS


def names() -> list:
    """Every row's name, in the table's order."""
    return [g.name for g in gpus.GPUS]


def find_spec(device_name: str | None) -> GPU | None:
    """The row for a device name: a row's own name, an alias (`core.gpus.ALIASES`) or a driver's
    name such as 'NVIDIA H100 80GB HBM3' (the first row whose `match` substrings it all holds);
    None if unknown.

    >>> find_spec("NVIDIA H100 PCIe").name
    'H100 PCIe'
    """
    if not device_name:
        return None
    name = device_name.lower().replace("-", " ")
    exact = next((g for g in gpus.GPUS if g.name.lower() == name.strip()), None)
    alias = gpus.ALIASES.get(name.strip())
    if exact is not None or alias is not None:
        return exact or gpu(alias)
    for spec in gpus.GPUS:
        if all(_has_token(name, m) for m in spec.match):
            return spec
    return None


def _has_token(name: str, needle: str) -> bool:
    # 'l4' must not match 'l40s', nor 't4' 'rtx 4090'-style names: require a word boundary
    # after short model numbers.
    i = name.find(needle)
    while i != -1:
        end = i + len(needle)
        before_ok = i == 0 or not name[i - 1].isalnum()
        after_ok = len(needle) > 3 or end == len(name) or not name[end].isdigit()
        if before_ok and after_ok:
            return True
        i = name.find(needle, i + 1)
    return False


def spec_peak(device_name: str | None, dtype: str = "bf16") -> tuple[float | None, str]:
    """(dense peak TFLOPS, source) from the spec table; (None, reason) when not known."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {dtype!r}")
    spec = find_spec(device_name)
    if spec is None:
        return None, f"no spec-sheet peak for {device_name!r}"
    value = spec.tflops.get(dtype)
    if value is None:
        return None, f"{spec.name} has no dense {dtype} figure in the table"
    return float(value), f"spec sheet: {spec.name} dense {dtype} ({spec.source})"


def runs_instead(spec: GPU, dtype: str) -> tuple[str, str] | None:
    """(the dtype training runs instead, what the card has: words after its name) for a dtype
    ``spec`` lists no peak for; None where it lists one or the table does not say.

    >>> runs_instead(find_spec("T4"), "bf16")[0]
    'fp16'
    """
    if dtype in spec.tflops:
        return None
    return spec.runs_instead.get(dtype)
