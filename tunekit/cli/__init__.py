"""The ``tunekit`` command (`main`): ``tunekit run`` on the Lab, ``tunekit plan`` (`plan`), the
model named on the command line (`model`), the offline HTML report of an executed notebook
(`report_html`) and the session summary on top of it (`summary`).
"""
from tunekit.cli.summary import show_summary

__all__ = ["show_summary"]
