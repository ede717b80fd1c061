"""A refusal reaches the user as their own line and the message: `user_facing`, on the public entry
points (``tunekit.plan``, ``tunekit.explain``, ``Lab(...)``, ``lab.run``, ``lab.plan``, ``lab.expect``...).

A refusal is an exception tunekit raises itself about what it was given: a ``ValueError``,
``TypeError`` or ``LookupError`` (``ToggleError`` and ``WontFitError`` are ValueErrors) whose
innermost frame is a ``raise`` statement in tunekit's source. Its message says everything (what
was given, what is allowed, what to try), so the frames between the user's call and that ``raise``
say nothing more. IPython and Jupyter show such an exception through its ``_render_traceback_``
(IPython's protocol for exceptions that format themselves): the traceback with tunekit's frames left
out, the user's own frames and lines kept. Plain Python prints every frame (it has no such
protocol), and the exception keeps its whole traceback either way (``%debug``, ``pdb.pm()``,
``traceback.print_exception``). Anything else (a failure inside torch, a bug of tunekit's own that
is no explicit ``raise``) keeps IPython's full traceback.

    >>> @user_facing
    ... def plan(device): raise ValueError(f"unknown device {device!r}")
"""
from __future__ import annotations

import functools
import linecache
import os
import pathlib
import traceback
import types

PACKAGE = str(pathlib.Path(__file__).resolve().parents[1]) + os.sep   # tunekit/ (not a sibling tunekit_x/)
REFUSED_KINDS = (ValueError, TypeError, LookupError)


def _ours(tb: types.TracebackType) -> bool:
    return str(pathlib.Path(tb.tb_frame.f_code.co_filename).resolve()).startswith(PACKAGE)


def is_refusal(e: BaseException) -> bool:
    """Whether ``e`` is tunekit refusing what it was given (the module's docstring says what counts)."""
    tb = e.__traceback__
    if not isinstance(e, REFUSED_KINDS) or tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    line = linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno).lstrip()
    return _ours(tb) and line.startswith("raise ")


def users_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback ``tb`` without tunekit's frames nor those that say ``__tracebackhide__`` (IPython's
    own ``run_code``, a magic's), as IPython hides them: a new chain, ``tb`` is left as it was."""
    kept, inside = [], False
    while tb is not None:
        # code a tunekit frame made and called (a dataclass's generated __init__: file "<string>") is tunekit's
        inside = _ours(tb) or (inside and tb.tb_frame.f_code.co_filename == "<string>")
        if not inside and not tb.tb_frame.f_locals.get("__tracebackhide__"):
            kept.append(tb)
        tb = tb.tb_next
    head = None
    for t in reversed(kept):
        head = types.TracebackType(head, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return head


def short_traceback(e: BaseException) -> list[str]:
    """The lines IPython shows for refusal ``e``: the traceback of the user's frames, then the
    message and its notes (chained causes as Python prints them)."""
    text = "".join(traceback.format_exception(type(e), e, users_frames(e.__traceback__)))
    return text.rstrip("\n").split("\n")


def user_facing(fn):
    """``fn`` (a public entry point) whose refusals IPython shows as the user's line and the message."""

    @functools.wraps(fn)
    def entry(*args, **kwargs):
        __tracebackhide__ = True  # noqa: F841  (a frame IPython leaves out of any traceback)
        try:
            return fn(*args, **kwargs)
        except REFUSED_KINDS as e:
            if is_refusal(e):
                e._render_traceback_ = functools.partial(short_traceback, e)
            raise

    return entry
