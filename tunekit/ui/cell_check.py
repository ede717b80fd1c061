"""A ``%%gpuprofile`` cell whose code cannot be parsed fails as a plain cell does. UI layer.

IPython turns a cell magic into ``get_ipython().run_cell_magic('gpuprofile', line, body)``; a
SyntaxError raised inside the magic would show the magic's frames and count as an executed cell.
This input transformer parses the body while IPython transforms the cell, so a SyntaxError is
raised before anything runs: IPython shows it with no frames (only the cell's line), the cell is
``error_before_exec`` and nothing is measured or recorded (a cell that never ran is not a run).
"""
from __future__ import annotations

import ast

_CALL = "run_cell_magic('gpuprofile'"


def magic_call(text: str) -> tuple[str, str] | None:
    """(option line, body) when ``text`` (a transformed cell) is one ``%%gpuprofile`` call."""
    if _CALL not in text:
        return None
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Expr):
        return None
    call = tree.body[0].value
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and call.func.attr == "run_cell_magic" and len(call.args) == 3
            and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in call.args)
            and call.args[0].value == "gpuprofile"):
        return None
    return call.args[1].value, call.args[2].value


class CellCheck:
    """The transformer (``shell.input_transformers_post``): ``lines`` back unchanged, or the
    cell's SyntaxError (UsageError for top-level ``await``) raised with the cell's line numbers."""

    def __init__(self, magics):
        self.magics = magics

    def __call__(self, lines: list[str]) -> list[str]:
        found = magic_call("".join(lines))
        if found is None:
            return lines
        line, body = found
        shell = self.magics.shell
        try:
            code = shell.transform_cell(body)
        except SyntaxError as e:  # IPython's tokenizer: count the magic's line
            e.lineno = e.lineno + 1 if isinstance(e.lineno, int) else e.lineno
            raise e.with_traceback(None) from None
        # the magic's own parse and compile (kept: its run reuses them), as In[N] of this cell
        try:
            self.magics._compile(code, body, shell.execution_count, f"%%gpuprofile {line}".rstrip())
        except SyntaxError as e:
            raise e.with_traceback(None) from None
        return lines
