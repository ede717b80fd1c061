"""Helpers that test files in more than one folder import (``from tests.helpers import Tty``).

A fixture goes in the conftest.py of the folder whose tests share it (tests/conftest.py when
several folders do); a plain function or class that tests call goes here."""


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
