"""A ``%%gpuprofile`` cell whose code cannot be parsed fails as a plain cell does.

The magic parses the cell itself, so its SyntaxError is raised from inside the magic: IPython
would show it with the magic's frames (a SyntaxError's traceback is printed whole, whatever
``__tracebackhide__`` says). The magic raises it as `cell_syntax_error` instead: the same class
name, message and position, marked so that the handler `install` adds to IPython's custom
exception handlers shows it as IPython shows a plain cell's, the cell's line and nothing else.
It is raised inside the cell's execution, where IPython takes any exception (a Ctrl-C
included). Nothing is recorded: a cell that never ran is not a run (the magic's side).
"""
from __future__ import annotations

import types


class CellError(Exception):
    """Marks a SyntaxError of a ``%%gpuprofile`` cell's own code (see `cell_syntax_error`)."""


_KINDS: dict = {}


def cell_syntax_error(e: SyntaxError) -> SyntaxError:
    """``e`` as an instance of a subclass of its own class with the same name (``SyntaxError``,
    ``IndentationError``...), marked `CellError`: ``except SyntaxError`` still catches it."""
    cls = type(e)
    kind = _KINDS.get(cls)
    if kind is None:
        kind = _KINDS[cls] = type(cls.__name__, (cls, CellError), {"__qualname__": cls.__qualname__,
                                                                    "__module__": cls.__module__})
    out = kind(e.msg, (e.filename, e.lineno, e.offset, e.text, e.end_lineno, e.end_offset))
    return out


def install(shell):
    """Show `CellError`s as plain syntax errors (no frames), before any custom handler the user
    set (kept: every other exception still goes to it). Returns what `uninstall` puts back."""
    before = (shell.custom_exceptions, shell.CustomTB)

    def show(self, etype, value, tb, tb_offset=None):
        if isinstance(value, CellError):
            stb = self.SyntaxTB.structured_traceback(type(value), value, [])
            self._showtraceback(type(value), value, stb)
            return stb
        return before[1](etype, value, tb, tb_offset=tb_offset)

    shell.custom_exceptions = tuple(before[0]) + (CellError,)
    shell.CustomTB = types.MethodType(show, shell)
    return before + (shell.CustomTB,)


def uninstall(shell, state) -> None:
    """Undo `install`, unless the user set custom handlers of their own since (theirs stay)."""
    exceptions, handler, ours = state
    if shell.CustomTB is ours:
        shell.custom_exceptions, shell.CustomTB = exceptions, handler
