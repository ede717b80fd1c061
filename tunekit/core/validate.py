"""Checks for values that cross a public boundary, before any work starts. Pure.

Each returns the value in its plain Python type (a numpy or torch integer scalar becomes an
``int``) or raises ``ValueError`` naming the argument, the value and what is allowed.

    >>> whole("micro_batch", numpy.int64(4))
    4
    >>> flag("compile", "yes")          # ValueError: compile must be True or False, got 'yes'
"""
from __future__ import annotations

import difflib
import functools
import inspect
import math
import numbers
import types


def is_whole(v) -> bool:
    """An integer, numpy/torch integer scalars included; never a bool."""
    if isinstance(v, bool) or getattr(v, "dtype", None) is not None and "bool" in str(v.dtype):
        return False
    if isinstance(v, numbers.Integral):
        return True
    # a 0-d torch integer tensor: has __index__ but is no numbers.Integral
    return hasattr(v, "__index__") and getattr(v, "ndim", 1) == 0


def whole(name: str, v, minimum: int = 1, maximum: int | None = None):
    """An integer in [minimum, maximum]."""
    if not is_whole(v) or not minimum <= int(v) <= (maximum if maximum is not None else int(v)):
        span = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be a whole number {span}, got {v!r}")
    return int(v)


def flag(name: str, v) -> bool:
    """True or False (numpy's bool_ too); "yes", 1 or None are refused."""
    if isinstance(v, bool) or type(v).__name__ == "bool_":
        return bool(v)
    raise ValueError(f"{name} must be True or False, got {v!r}")


def real(name: str, v, low: float = 0.0, high: float = math.inf, low_open: bool = True,
         high_open: bool = False, what: str | None = None) -> float:
    """A finite number in the given interval (open at ``low`` by default). ``what``: the
    allowed values in words for the message (default: the interval)."""
    ok = isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
    if ok:
        ok = (v > low if low_open else v >= low) and (v < high if high_open else v <= high)
    if not ok:
        lo = f"{'>' if low_open else '>='} {low:g}"
        hi = "" if high == math.inf else f" and {'<' if high_open else '<='} {high:g}"
        raise ValueError(f"{name} must be {what or f'a finite number {lo}{hi}'}, got {v!r}")
    return float(v)


def count(name: str, v, what: str = "a whole number >= 1"):
    """A finite number >= 1 without a fractional part (``64`` and ``64.0``; never a bool): how many
    of something. ``what`` is the wording of the message."""
    ok = isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) and v >= 1
    if not ok or not float(v).is_integer():
        raise ValueError(f"{name} must be {what}, got {v!r}")
    return int(v)


def one_of(name: str, v, allowed: tuple):
    """One of a few plain values, said in words: ``zero_stage must be 0, 1, 2 or 3, got True``
    (a bool is never taken for 0 or 1)."""
    if isinstance(v, bool) or v not in allowed:
        words = ", ".join(map(str, allowed[:-1])) + f" or {allowed[-1]}"
        raise ValueError(f"{name} must be {words}, got {v!r}")
    return v


def memory_budget_bytes(name: str, v):
    """A memory budget: None (no budget) or a finite number of bytes > 0, as an int (rounded up,
    so a budget stays above 0)."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0 < v < math.inf:
        raise ValueError(f"{name} must be a finite number of bytes > 0, or None, got {v!r}")
    return math.ceil(v)


def text(name: str, v) -> str:
    """A string."""
    if not isinstance(v, str):
        raise ValueError(f"{name} must be a string, got {v!r}")
    return v


def collect(errors: list, check, name: str, v, *args, **kwargs):
    """``check(name, v, ...)``, its message appended to ``errors`` instead of raised (to refuse
    every bad argument at once); returns the checked value, or None when it failed."""
    try:
        return check(name, v, *args, **kwargs)
    except ValueError as e:
        errors.append(str(e))
        return None


def optional(check):
    """``check`` that also lets None through: ``optional(whole)("max_micro_batch", None)``."""
    return lambda name, v, *args: None if v is None else check(name, v, *args)


def did_you_mean(near, *, quote: bool = True, lead: str = ": ") -> str:
    """The one form of every suggestion tunekit's messages make, at the end of the clause that refuses:
    ": did you mean 'bf16'?" (``quote`` False: the words as they are, a keyword=value, an option, a
    run reference: ": did you mean --steps?"; ``lead``: what comes before it); "" for none (``near``
    None or ""). What a message says after it is in parentheses: "unknown device 'H100X': did you
    mean 'H100 SXM'? (the devices: ...)".

    >>> did_you_mean("bf16"), did_you_mean("preset='gpt2-124m'", quote=False, lead=""), did_you_mean(None)
    (": did you mean 'bf16'?", "did you mean preset='gpt2-124m'?", '')
    """
    if near is None or near == "":
        return ""
    return f"{lead}did you mean {near!r}?" if quote else f"{lead}did you mean {near}?"


def choice(name: str, v, allowed) -> str:
    """``v`` where ``allowed`` holds it; else a ValueError naming the allowed values and, for a
    value spelled close to one (case, a dash: 'BF16', 'bf-16'), that one: "did you mean 'bf16'?"."""
    if v not in tuple(allowed):
        near = nearest(v, allowed)
        raise ValueError(f"{name} must be one of {tuple(allowed)}, got {v!r}{did_you_mean(near)}")
    return v


def nearest(v, allowed):
    """The allowed value ``v`` was probably meant as, or None: the same case and punctuation
    aside, else the first (in ``allowed``'s order) that ``v`` of 3 or more letters begins, else
    difflib's closest: ``nearest("BF16", ("fp32", "bf16"))`` -> 'bf16'; ``nearest("gpt2",
    ("gpt2-124m", "gpt2-350m"))`` -> 'gpt2-124m' (difflib, scoring both alike, would take the last)."""
    if not isinstance(v, str):
        return None
    words = [a for a in allowed if isinstance(a, str)]
    squeezed = {"".join(c for c in a.lower() if c.isalnum()): a for a in words}
    key = "".join(c for c in v.lower() if c.isalnum())
    if key in squeezed:
        return squeezed[key]
    begun = [a for k, a in squeezed.items() if len(key) >= 3 and k.startswith(key)]
    if begun:
        return begun[0]
    close = difflib.get_close_matches(v.lower(), [a.lower() for a in words], n=1, cutoff=0.6)
    return next((a for a in words if a.lower() == close[0]), None) if close else None


def fraction(name: str, v) -> float:
    """A finite number in [0, 1]."""
    return real(name, v, 0.0, 1.0, low_open=False)


def function(name: str, v, takes: str):
    """A callable; ``takes`` says what it is called with and returns (for the message)."""
    if not callable(v) or isinstance(v, type):
        raise TypeError(f"{name} must be a function {takes}, got {_what(v)}")
    return v


def optional_callable(name: str, v, returning: str):
    """None or something callable (a class too); ``returning`` says what it returns."""
    if v is not None and not callable(v):
        raise ValueError(f"{name} must be None or a callable returning {returning}, got {v!r}")
    return v


def instance(name: str, v, cls, hint: str):
    """An instance of ``cls``. Given the class itself (``Lab(MLP)``), the message says to call it."""
    if isinstance(v, type) and issubclass(v, cls):
        raise TypeError(f"{name} is the class {v.__name__}, not a model: pass an instance, "
                        f"e.g. {v.__name__}(...) instead of {v.__name__}")
    if not isinstance(v, cls):
        raise TypeError(f"{name} must be {hint}, got {_what(v)}")
    return v


DEVICE_TYPES = ("cpu", "cuda", "mps")


def device(name: str, v, counts: dict | None = None) -> str:
    """A device as ``"type"`` or ``"type:index"`` (a string, a torch.device or a CUDA index).

    ``counts``: how many devices of each type this machine has (``{"cpu": 1, "cuda": 0}``);
    None checks the form only (a device to plan for, not to run on).

    >>> device("device", "cuda:1", {"cpu": 1, "cuda": 2})
    'cuda:1'
    """
    text = f"cuda:{int(v)}" if is_whole(v) else str(v) if type(v).__name__ == "device" else v
    kind, _, index = text.partition(":") if isinstance(text, str) else (None, "", "")
    if kind not in DEVICE_TYPES or index and not (index.isdigit() and str(int(index)) == index):
        raise ValueError(f"{name} must be one of {DEVICE_TYPES}, optionally with an index "
                         f"('cuda:1'), or a torch.device, got {v!r}")
    if counts is not None:
        n = counts.get(kind, 0)
        if n == 0:
            raise ValueError(f"{name}={v!r}: this machine has no {kind.upper()} device (torch sees none); "
                             "use 'cpu' here, or run where one is")
        if index and int(index) >= n:
            raise ValueError(f"{name}={v!r}: this machine has {n} {kind.upper()} device(s), "
                             f"indices 0 to {n - 1}")
    return text


def _fits(allowed, v) -> bool:
    """Whether ``v`` is one of ``allowed`` (a tuple of plain values, or a predicate)."""
    try:
        return bool(allowed(v)) if callable(allowed) else v in tuple(allowed)
    except TypeError:   # an unhashable value, a predicate that cannot take it
        return False


def meant(name: str, v, names, choices: dict | None = None) -> str:
    """The keyword a user probably meant by ``name=v``, as help to end a message with: the closest
    of ``names`` where ``name`` is a misspelling of one, else a keyword whose ``choices`` (name ->
    allowed values or a predicate) take ``v``; "" when none. ``choices[name]``, where given, is
    what ``name`` takes: a value it takes gets no help.

    >>> meant("presett", "gpt2-124m", ("preset", "device"))
    "did you mean preset='gpt2-124m'?"
    >>> meant("model", "gpt2-124m", ("model", "preset"), {"preset": ("gpt2-124m",)})
    "did you mean preset='gpt2-124m'?"
    """
    choices = choices or {}
    if name in choices and _fits(choices[name], v):
        return ""
    close = difflib.get_close_matches(name, [n for n in names if n != name], n=1, cutoff=0.6)
    fits = [n for n, allowed in choices.items() if n != name and _fits(allowed, v)]
    if close and (close[0] in fits or close[0] not in choices or not fits):
        return did_you_mean(f"{close[0]}={v!r}", quote=False, lead="")
    return did_you_mean(f"{fits[0]}={v!r}", quote=False, lead="") if fits else ""


def keywords_checked(choices: dict | None = None):
    """Decorate a function (or ``__init__``) so that a keyword it does not take is refused with
    the one the user probably meant (`meant`): ``plan(cfg, precison="bf16")`` raises
    ``TypeError: plan() got an unexpected keyword argument 'precison': did you mean
    precision='bf16'?``; and, for ``choices`` (keyword -> allowed values or a predicate), a value
    its own keyword refuses and another takes is refused with that keyword (ValueError). The
    signature read is the one ``inspect.signature`` shows (a ``__signature__`` set before
    this decorator counts); a function taking ``**kwargs`` there is left to refuse its own."""
    def wrap(fn):
        sig = inspect.signature(fn)
        params = sig.parameters
        names = [key for key, p in params.items() if key != "self"
                 and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY)]
        open_ended = any(p.kind is p.VAR_KEYWORD for p in params.values())
        where = fn.__qualname__.removesuffix(".__init__")

        @functools.wraps(fn)
        def checked(*args, **kwargs):
            if not open_ended:
                more = getattr(fn, "_step_words", lambda: ())()   # a step word declared after the decoration
                for k, v in kwargs.items():
                    if k not in params and k not in more:
                        hint = meant(k, v, names, choices)
                        raise TypeError(f"{where}() got an unexpected keyword argument {k!r}"
                                        + (f": {hint}" if hint else f"; it takes {', '.join(names)}"))
            if choices:
                try:
                    given = sig.bind_partial(*args, **kwargs).arguments
                except TypeError:
                    given = {}      # too many positionals: the call itself says so
                for k, v in given.items():
                    if k in choices and isinstance(v, str) and not _fits(choices[k], v):
                        hint = meant(k, v, (), choices)
                        if hint:
                            raise ValueError(f"{where}(): {k}={v!r} is not what {k} takes: {hint}")
            return fn(*args, **kwargs)
        return checked
    return wrap


def _what(v) -> str:
    return f"{type(v).__name__} {v!r}"[:120]


class LiveSignature(inspect.Signature):
    """A signature whose parameters are listed when asked (``inspect.signature``, ``help()``,
    Jupyter's ``?``): ``build()`` reads the declaration as it is then, so a toggle declared after
    import is shown. Its copies (``replace``, a bound method's) are plain signatures.

    Example: ``fn.__signature__ = LiveSignature(build(), build=build)``."""

    __slots__ = ("_build",)

    def __init__(self, parameters=None, *, return_annotation=inspect.Signature.empty,
                 __validate_parameters__=True, build=None):
        super().__init__(parameters, return_annotation=return_annotation,
                         __validate_parameters__=__validate_parameters__)
        self._build = build

    @property
    def parameters(self):
        if self._build is None:
            return super().parameters
        return types.MappingProxyType({p.name: p for p in self._build()})


def live_signature(fn, build) -> None:
    """Give ``fn`` the signature ``build()`` lists, listed again whenever it is read (`LiveSignature`)."""
    fn.__signature__ = LiveSignature(build(), return_annotation=inspect.signature(fn).return_annotation,
                                     build=build)
