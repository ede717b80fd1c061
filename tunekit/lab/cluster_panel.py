"""The dashboard's Run on a cluster target: the job submitted (``lab.run(on=target, wait=False)``),
followed without blocking the kernel, shown in the dashboard's status line, stoppable.

    >>> dash = lab.dashboard(on=tunekit.Slurm(partition="gpu", gpus_per_node=8))
    >>> dash.run_on.value = dash.run_on.options[1][1]; dash.run_button.click()   # returns at once
    >>> dash.job_line.value      # "slurm job 7: pending (Resources)", then "... running on n0, step 4/20"
    >>> dash.stop_button.click() # scancel: the job is gone, nothing recorded

Run returns as soon as ``sbatch`` has the job; the ClusterRun's thread (tunekit.lab.cluster_run)
then tells `ClusterPanel` of each change: the line under the buttons says the job's state in
Slurm's words (pending with its reason, running on its nodes with the steps its folder reports),
the progress bar follows the steps, and at the end the run is shown as a run here is (its line,
the diff, the table), or the failure's cause is said (its failed run, with the steps measured so
far, is in the log). Stop, or Ctrl-C while a cell waits on ``dash.cluster_run.result()``,
cancels the job; a cancelled run is not recorded (as an interrupted run here is not).
"""
from __future__ import annotations

import html
import threading

import ipywidgets as W


def _box(text: str, color: str) -> str:
    return f'<div style="border-left:4px solid {color};padding:4px 8px;margin:4px 0">{text}</div>'


class ClusterPanel:
    """``stop_button`` and ``line`` (the job's status line) of a Dashboard ``dash``; `submit` is
    its Run on a cluster target. The ClusterRun is ``dash.cluster_run``."""

    def __init__(self, dash):
        self.dash = dash
        self.stop_button = W.Button(description="Stop", button_style="danger", icon="stop",
                                    tooltip="cancel the cluster job (scancel): nothing is recorded",
                                    layout=W.Layout(display="none"))
        self.line = W.HTML()
        self.stop_button.on_click(self.stop)
        self._lock, self._ended = threading.Lock(), None   # the handle whose end is shown

    def submit(self, target, steps: int) -> None:
        """``lab.run(on=target, wait=False)`` of the controls' setting; `_on_job` shows it as it goes.
        A run refused before anything is submitted is said in the message area, as a run here."""
        dash = self.dash
        dash.progress.description = "submitting"
        dash.run_button.disabled = True
        ranks = target.ranks_per_node * target.nodes
        handle = dash._attempt("run", lambda: dash.lab.run(
            steps=steps, warmup=dash.controls["warmup"].value, verbose=False, on=target, wait=False,
            parallel="ddp" if ranks > 1 else None, **dash.toggles()))   # trace: one process here, not a job
        if handle is None:
            dash.run_button.disabled = False
            dash.progress.description = "idle"
            return
        dash.cluster_run = handle
        self.stop_button.layout.display = ""
        dash.message.value = _box(f"submitted slurm job {html.escape(handle.job.job_id)}: the kernel is free; "
                                  "its run lands in the table when it ends, Stop cancels it", "#1f77b4")
        handle.watch(self._on_job)

    def _on_job(self, handle, ended: bool) -> None:
        """From the job's thread (`ClusterRun.watch`): the status line and the progress bar follow
        the job; at its end the run is shown, or the failure said."""
        dash = self.dash
        with self._lock:
            if self._ended is handle:   # its end is shown already (a late call after it)
                return
            if ended:
                self._ended = handle
        self.line.value = f'<div style="font-family:monospace;font-size:12px">{html.escape(handle.line())}</div>'
        dash.progress.value = min(handle.steps_done, dash.progress.max)
        waits_on = handle.info.get("Reason")   # Slurm's word for what a pending job waits for
        if handle.steps_done:
            dash.progress.description = f"step {handle.steps_done}/{handle.job.steps}"
        elif handle.state == "PENDING" and waits_on not in (None, "None"):
            dash.progress.description = f"pending: {waits_on}"
        else:
            dash.progress.description = handle.state.lower()
        if not ended:
            return
        self.stop_button.layout.display = "none"
        dash.run_button.disabled = False
        if handle.cancelled:
            dash.progress.description = "cancelled"
            dash.message.value = _box(f"slurm job {html.escape(handle.job.job_id)} cancelled: not recorded",
                                      "#e65100")
        elif handle.recorded is not None and handle.recorded.status == "ok":
            dash.progress.description = "done"
            dash._show_run(handle.recorded)
        else:   # ended without a result: its failed run (the cause, the steps so far) is in the log
            dash.progress.description = "failed"
            dash.last_error = handle.error
            dash.message.value = _box(f"run on the cluster failed: {html.escape(str(handle.error))}", "#d62728")
            dash.refresh()

    def stop(self, _button=None) -> None:
        """scancel the job under way and wait until Slurm has it gone (nothing recorded)."""
        handle = self.dash.cluster_run
        if handle is not None and not handle.done():
            self.stop_button.disabled = True
            try:
                handle.cancel()
            finally:
                self.stop_button.disabled = False
