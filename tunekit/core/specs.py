"""Reading the GPU table (core.gpus, one `GPU` row per card, each figure with its source): the row
for a device name (the one home of which card a name means: `find_spec`, `card`, and
`device_type` for a name that is no card), its dense spec-sheet peak, what it trains instead of a
dtype it has no peak for. Pure, no torch.
"""
from __future__ import annotations

import difflib
import re

from tunekit.core import gpus
from tunekit.core.gpu import GPU
from tunekit.core.registry import BF16, DTYPES
from tunekit.core.validate import DEVICE_TYPES, did_you_mean


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
    exact = next((g for g in gpus.GPUS if _squeezed(g.name) == _squeezed(name)), None)
    alias = next((row for a, row in gpus.ALIASES.items() if _squeezed(a) == _squeezed(name)), None)
    if exact is not None or alias is not None:
        return exact or gpu(alias)
    return next((spec for spec in gpus.GPUS if matches(name, spec)), None)


def card(device_name: str) -> GPU:
    """`find_spec`'s row for a device name a plan is placed on; an unknown name is refused with
    the row (or 'cpu') it looks like, and the table's names.

    >>> card("H100X")   # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: unknown device 'H100X': did you mean 'H100 SXM'? (the devices: H100 NVL, ..., or 'cpu')
    """
    spec = find_spec(device_name)
    kind = device_name.strip().lower().partition(":")[0]
    if spec is None and kind in ("cuda", "mps", "gpu"):   # a kind of device: no memory size nor peak to plan with
        raise ValueError(f"{device_name!r} is a kind of device, not a card: name the card to plan for, e.g. "
                         "'H100 SXM', 'A100 80GB', 'L4' or 'RTX 4090' (this machine's: "
                         f"torch.cuda.get_device_name()), one of {', '.join(names())}, or 'cpu'")
    if spec is None:
        known = {n.lower(): n for n in [*names(), "cpu"]}
        asked = device_name.strip().lower()   # the cards of its family (its first two characters) first, then any
        family = [n for n in known if n[:2] == asked[:2]]
        base = find_spec(" ".join(w for w in re.findall(r"[a-z0-9]+", asked) if w not in VARIANT_WORDS))
        close = [base.name] if base else [known[c] for c in difflib.get_close_matches(asked, family, n=1, cutoff=0.5)
                                          or difflib.get_close_matches(asked, list(known), n=1, cutoff=0.5)]
        raise ValueError(f"unknown device {device_name!r}{did_you_mean(close[0] if close else None)} "
                         f"(the devices: {', '.join(names())}, or 'cpu')")
    _check_size(device_name, spec)
    return spec


def _check_size(device_name: str, spec: GPU) -> None:
    """Refuses a name that gives a memory size its row lacks ("A100 40" read as the A100 80GB):
    "A100 40GB", "A100 40", "a100-40g" name a size; a number in the card's own name (RTX 4090) does not."""
    low = device_name.lower()
    named = re.search(r"(\d+)\s*gb", low) or re.search(r"(?:^|[\s_-])(\d+)\s*g?(?=$|[\s_-])", low)
    if spec.memory_gb is None or not named or named.group(1) in re.findall(r"\d+", spec.name) \
            or int(named.group(1)) == round(spec.memory_gb):
        return
    sized = [n for n in names() if n.split()[0] == spec.name.split()[0]
             and (other := find_spec(n)) is not None and round(other.memory_gb or 0) == int(named.group(1))]
    rest = f"plan for {spec.name!r} and set its total_bytes against your card's memory, or pick a device of the table"
    raise ValueError(f"{device_name!r} names {named.group(1)} GB, but the spec table's {spec.name} has "
                     f"{spec.memory_gb:g} GB" + (f"{did_you_mean(sized[0])} (else {rest})" if sized else f": {rest}"))


def device_type(device_name: str) -> str | None:
    """The torch device type a name is rather than a card ("cpu", "cuda", "mps", any case, with an
    index or not: "cuda:1" is "cuda"); None for any other name.

    >>> device_type("cuda:1"), device_type("CPU"), device_type("H100")
    ('cuda', 'cpu', None)
    """
    kind = device_name.strip().lower().partition(":")[0]
    return kind if kind in DEVICE_TYPES else None


def _squeezed(name: str) -> str:
    """A name as typed without case, spaces, '-' or '_': 'RTX3090', 'rtx-3090' and 'RTX 3090' are
    one name, and 'A100_40GB' is 'A100 40GB' (a row's or an alias's whole name, not a part of it)."""
    return re.sub(r"[\s_-]+", "", name.lower())


# words that make another product of a card's name (NVIDIA's names as the driver prints them: 'GeForce RTX
# 3090 Ti', 'RTX 4080 SUPER', 'RTX 4090 Laptop GPU', 'RTX 4090 D', 'Quadro RTX 5000 with Max-Q Design'): other
# clocks, memory or power, so a name holding one matches no row that lacks it (refused, not planned as the base card)
VARIANT_WORDS = frozenset({"ti", "super", "laptop", "mobile", "max", "d"})


def matches(name: str, spec: GPU) -> bool:
    """Whether a driver's name (lower case, '-' as spaces) holds each of the row's ``match`` words and no
    product-variant word (`VARIANT_WORDS`) the row's own name lacks."""
    words = set(spec.name.lower().replace("-", " ").split())
    variants = (set(re.findall(r"[a-z0-9]+", name)) & VARIANT_WORDS) - words
    return not variants and all(_has_token(name, m, words) for m in spec.match)


def _has_token(name: str, needle: str, words: set) -> bool:
    # a needle starts a word of the name, and that word is the needle itself or a word of the row's
    # own name: 'l4' does not match 'l40s', 'a10' matches 'a10g' (the row A10G), 'mi300' 'mi300x',
    # and a typo such as 'h100x' matches no row (it is refused, not read as an H100)
    i = name.find(needle)
    while i != -1:
        word = re.match(r"[a-z0-9]*", name[i:]).group(0)
        if (i == 0 or not name[i - 1].isalnum()) and (word == needle or word in words):
            return True
        i = name.find(needle, i + 1)
    return False


def spec_peak(device_name: str | None, dtype: str = BF16) -> tuple[float | None, str]:
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
