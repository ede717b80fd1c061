"""Where tunekit's output goes: the one home of "is there an IPython shell, and of what kind".

    >>> shell()          # the running IPython shell, None in plain Python (a script, pytest)
    >>> in_notebook()    # a Jupyter kernel: HTML displays and widgets are drawn
    >>> in_terminal()    # a terminal IPython: text only, no widget
    >>> show(Summary(record))   # displayed in a shell (HTML in a notebook), printed elsewhere

IPython is never imported here: a process that did not import it has no shell.
"""
from __future__ import annotations

import sys


def shell():
    """The running IPython shell (kernel, terminal or a test's InteractiveShell); None without one."""
    if "IPython" not in sys.modules:
        return None
    from IPython import get_ipython

    return get_ipython()


def in_notebook() -> bool:
    """A Jupyter kernel (not terminal IPython, not a test's InteractiveShell)."""
    ip = shell()
    return ip is not None and getattr(ip, "kernel", None) is not None


def in_terminal() -> bool:
    """A terminal IPython: it shows a display's text/plain, never a widget."""
    terminal = sys.modules.get("IPython.terminal.interactiveshell")
    return terminal is not None and isinstance(shell(), terminal.TerminalInteractiveShell)


def show(obj) -> None:
    """``obj`` (a summary: ``core.summary.Summary`` of a record) where the user reads it: displayed in
    an IPython shell (its HTML in a notebook, its text in a terminal), printed in plain Python."""
    if shell() is None:
        print(obj)
        return
    from IPython.display import display

    display(obj)
