"""The ``tunekit`` command (`main`): ``tunekit run`` on the Lab, ``tunekit plan`` (`plan`), the
model named on the command line (`model`), and the offline HTML report of an executed notebook
(`report_html`).
"""
import importlib

__all__ = ["show_summary"]


def __getattr__(name):
    # resolved on first use, not at import: `python -m tunekit.cli.report_html` (make tour) would
    # otherwise find its module imported by this package first and warn (runpy's RuntimeWarning)
    if name == "show_summary":
        return importlib.import_module("tunekit.cli.report_html").show_summary
    raise AttributeError(f"module 'tunekit.cli' has no attribute {name!r}")
