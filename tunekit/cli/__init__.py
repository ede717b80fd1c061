"""The ``tunekit`` command (`main`): ``tunekit run`` on the Lab, ``tunekit plan`` (`plan`), the
model named on the command line (`model`), and the offline HTML report of an executed notebook
(`report_html`).
"""
from tunekit.cli.report_html import show_summary

__all__ = ["show_summary"]
