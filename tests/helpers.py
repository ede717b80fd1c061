"""Helpers that test files in more than one folder import (``from tests.helpers import Tty``).

A fixture goes in the conftest.py of the folder whose tests share it (tests/conftest.py when
several folders do); a plain function or class that tests call goes here."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_script(relpath: str, name: str | None = None):
    """A script of the repository (``"benchmarks/bench_expect.py"``) imported as a module, run
    from a fresh copy each call."""
    path = ROOT / relpath
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Tty:
    """stderr on a terminal: what is written, and isatty() True (``Tty(False)``: a pipe or a file)."""

    def __init__(self, tty=True):
        self.text, self.tty = "", tty

    def write(self, s):
        self.text += s

    def flush(self):
        pass

    def isatty(self):
        return self.tty
