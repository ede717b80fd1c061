"""The ``tunekit`` command's argument parsing: a refusal is one line on stderr with the option,
command or value probably meant (exit 2 before any work), and the help lists defaults as given.
A name of tunekit's Python API typed as a command is said as such, not matched to a command:

    $ tunekit explain
    tunekit: error: argument COMMAND: invalid choice: 'explain' (choose from 'run', 'plan', 'diff', 'doctor'):
    'explain' is tunekit.explain() in Python, not a command (from a shell: tunekit run --trace) (see tunekit --help)
"""
from __future__ import annotations

import argparse
import difflib
import re

from tunekit.core.validate import did_you_mean


class Parser(argparse.ArgumentParser):
    """An argparse parser whose refusal is one line naming what was probably meant."""

    def error(self, message):  # one line, exit 2 (argparse would print the usage block first)
        self.exit(2, f"{self.prog}: error: {message}{self._nearest(message)} (see {self.prog} --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        ns, extra = super().parse_known_args(args, namespace)
        if extra and " " in self.prog:   # a command's parser ("tunekit run"): said by it, with its options
            self.error(f"unrecognized arguments: {' '.join(extra)}")
        return ns, extra

    def _nearest(self, message: str) -> str:
        """': did you mean --steps?' for a misspelled option or command, from the names it could be."""
        if m := re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message):
            word, names = m.group(1), re.findall(r"'([^']*)'", m.group(2))
            if said := _python_only(word) if self.prog == "tunekit" else None:
                return said
            if message.startswith("argument --precision:"):   # a dtype's other name: 'half', 'float32'
                from tunekit.core.registry import precision_meant

                near = precision_meant(word)
                return did_you_mean(near)
        elif m := re.match(r"unrecognized arguments: (--[^\s=]+)", message):
            word, names = m.group(1), list(self._option_string_actions)
        else:
            return ""
        near = difflib.get_close_matches(word, names, n=1)
        if not near:
            return ""
        return did_you_mean(near[0], quote=not near[0].startswith("-"))


# what a shell runs instead of a Python-only name typed as a command ("tunekit explain")
SHELL_FOR = {"explain": "tunekit run --trace", "lab": "tunekit run", "estimate_memory": "tunekit plan",
             "advise": "tunekit plan"}


def _python_only(word: str) -> str | None:
    """': 'explain' is tunekit.explain() in Python, not a command (from a shell: tunekit run --trace)'
    for a word that names tunekit's Python API (any case), else None: no command is guessed for it."""
    import tunekit

    name = next((n for n in tunekit.__all__ if n.lower() == word.lower()), None)
    if name is None:
        return None
    shell = SHELL_FOR.get(word.lower())
    return f": {word!r} is tunekit.{name}() in Python, not a command" + (f" (from a shell: {shell})" if shell else "")


class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults in the help, descriptions as written."""
