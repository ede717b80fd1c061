"""What a Lab has recorded and how it shows itself: its runs (``lab.runs``), the results table,
the comparison chart, saving and loading the JSONL run log, and the Lab's repr.

A mixin of `lab.lab.Lab` (kept apart so the Lab's own module holds what it does with the
live model); it reads ``self.log`` (a `lab.runlog.RunLog`), ``self.model``, ``self.device``.
"""
from __future__ import annotations

from pathlib import Path

from tunekit.core.paths import runs_dir
from tunekit.core.results import RunResult
from tunekit.core.run_text import lab_html, lab_rows, lab_text
from tunekit.lab.runlog import RunLog
from tunekit.models.naming import model_label


class LabResults:
    """The recorded side of a `Lab`: runs, results, compare, save/load, repr.

    Example: ``lab.results()``, ``lab.compare()``, ``tunekit.Lab.load_results()``."""

    def save_results(self, path) -> Path:
        """Append every run of this Lab to the JSONL log ``path`` (e.g. when the Lab's own log
        could not be written). Returns the path. Example: ``lab.save_results("runs.jsonl")``."""
        return self.log.save_to(path)

    @property
    def runs(self) -> list[RunResult]:
        """Every run of this Lab (and its log's earlier ones), oldest first."""
        return list(self.log.runs)

    def results(self, all: bool = False):
        """pandas DataFrame, one row per run (this session's and the log's earlier ones): what ran,
        tokens/s (samples/s), step time, TFLOPS, MFU, peak memory, the machine and the status
        (``core.results.RESULT_COLUMNS``), shown formatted; ``all=True``: every column (toggles,
        FLOPs, bytes, energy, notes...), a plain DataFrame. The values are the raw numbers either way.

        Example: ``lab.results(all=True)[["label", "tokens_per_s", "peak_mem_bytes"]]``."""
        from tunekit.core.results import runs_table
        return runs_table(self.log.runs, all, "lab.results(all=True)")

    def compare(self, baseline: int = 0):
        """plotly Figure: tokens/s and peak memory per run, the ``baseline`` run marked.

        Example: ``lab.compare(baseline=0).show()``."""
        from tunekit.lab.plots import compare_figure
        return compare_figure(self.results(all=True), baseline=baseline)

    @staticmethod
    def load_results(path=None, all: bool = False):
        """The runs of a JSONL log written by a Lab (partial last lines skipped), as ``lab.results()``
        shows them: the curated columns formatted, ``all=True`` every column (a plain DataFrame).
        ``path=None``: the newest day's log under ``core.paths.runs_dir()`` (after a kernel restart,
        say), every Lab of that day; its ``session`` column (``all=True``) tells the Labs apart.
        Example: ``df = tunekit.Lab.load_results(all=True); df[df.session == df.session.iloc[-1]]``
        (the latest Lab's runs, every column)."""
        from tunekit.core.results import runs_table
        runs = RunLog.newest(runs_dir()) if path is None else RunLog.load(path)
        return runs_table(runs, all, "Lab.load_results(all=True)")

    def _summary_rows(self) -> list:
        n_params = sum(p.numel() for p in self.model.parameters())
        data = "your batch_fn" if self.batcher is None else f"data={self.data!r}"
        return lab_rows(model_label(self.model), n_params, str(self.device), self.resolve().asdict(), data,
                        self.log.runs, self.log_path)

    def __repr__(self) -> str:  # a terminal: the model, the toggles runs start from, the runs so far
        return lab_text(self._summary_rows())

    def _repr_html_(self) -> str:
        return lab_html(self._summary_rows())
