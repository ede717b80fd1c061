"""monitor/sinks: each sink's figures read back with the tool's own reader; every bad target
refused at open_sinks, before anything is written; a failing sink dropped with one warning."""
import json
import math
import os
import subprocess
import sys
import time
import warnings

import numpy
import pytest
import torch

from tunekit.monitor.sinks import open_sinks

# four steps: figures of every accepted kind, and values that must be left out (NaN, inf, None)
STEPS = [
    (1, {"loss": 2.5, "tokens": 4096, "lr": numpy.float32(0.25)}),
    (2, {"loss": torch.tensor(2.25), "tokens": numpy.int64(8192), "grad_norm": math.nan}),
    (3, {"loss": 0.125, "lr": None, "grad_norm": math.inf}),
    (4, {"loss": float("nan")}),                      # nothing left: no write at all
]
LOSS = [(1, 2.5), (2, 2.25), (3, 0.125)]             # exact in float32 too (TensorBoard's scalars)


def _write_steps(sinks):
    for step, metrics in STEPS:
        sinks.write(step, metrics)


def test_jsonl_lines_read_back_with_json(tmp_path):
    path = tmp_path / "new" / "folder" / "steps.jsonl"   # parents created
    before = time.time()
    sinks = open_sinks(f"jsonl:{path}")
    assert bool(sinks) and "jsonl:" in repr(sinks)
    _write_steps(sinks)
    sinks.close()
    after = time.time()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert all(before <= line.pop("time") <= after for line in lines)
    assert lines == [{"step": 1, "tunekit/loss": 2.5, "tunekit/tokens": 4096.0, "tunekit/lr": 0.25},
                     {"step": 2, "tunekit/loss": 2.25, "tunekit/tokens": 8192.0},
                     {"step": 3, "tunekit/loss": 0.125}]
    again = open_sinks([f"jsonl:{path}"])                 # appends
    again.write(5, {"loss": 1})
    again.close()
    assert json.loads(path.read_text().splitlines()[-1])["tunekit/loss"] == 1.0
    assert len(path.read_text().splitlines()) == 4


def test_tensorboard_scalars_read_back_with_event_accumulator(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sinks = open_sinks(f"tensorboard:{tmp_path / 'tb'}")
    _write_steps(sinks)
    sinks.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {"tunekit/loss", "tunekit/tokens", "tunekit/lr"}
    assert [(e.step, e.value) for e in acc.Scalars("tunekit/loss")] == LOSS
    assert [(e.step, e.value) for e in acc.Scalars("tunekit/tokens")] == [(1, 4096.0), (2, 8192.0)]
    assert [(e.step, e.value) for e in acc.Scalars("tunekit/lr")] == [(1, 0.25)]


@pytest.fixture
def file_store(tmp_path, monkeypatch):
    """A local MLflow folder store (opted in where MLflow asks for it); the user's URI elsewhere."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "elsewhere").as_uri())
    return tmp_path / "mlruns"


def _history(uri, run_id, key="tunekit/loss"):
    from mlflow.tracking import MlflowClient

    return sorted((m.step, m.value) for m in MlflowClient(uri).get_metric_history(run_id, key))


def test_mlflow_metrics_read_back_with_mlflow_client(file_store):
    from mlflow.tracking import MlflowClient

    before = time.time()
    sinks = open_sinks(f"mlflow:{file_store}")
    _write_steps(sinks)
    sinks.close()
    again = open_sinks("mlflow:" + file_store.as_uri())   # a file: URI is the same store
    again.write(7, {"loss": 0.5})
    again.close()
    client = MlflowClient(file_store.as_uri())
    runs = client.search_runs([client.get_experiment_by_name("tunekit").experiment_id],
                              order_by=["attributes.start_time ASC"])
    assert [r.info.status for r in runs] == ["FINISHED", "FINISHED"]   # ours, ended at close
    first = runs[0].info.run_id
    assert _history(file_store.as_uri(), first) == LOSS
    assert _history(file_store.as_uri(), first, "tunekit/tokens") == [(1, 4096.0), (2, 8192.0)]
    assert _history(file_store.as_uri(), runs[1].info.run_id) == [(7, 0.5)]
    stamps = [m.timestamp for m in client.get_metric_history(first, "tunekit/loss")]
    assert all(before * 1000 - 1 <= t <= time.time() * 1000 + 1 for t in stamps)


def test_mlflow_logs_into_the_users_active_run_and_leaves_it_open(file_store, monkeypatch):
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", file_store.as_uri())
    with mlflow.start_run() as run:
        sinks = open_sinks(f"mlflow:{file_store}")
        sinks.write(1, {"loss": 2.5})
        sinks.close()
        assert mlflow.active_run().info.run_id == run.info.run_id
        assert mlflow.MlflowClient(file_store.as_uri()).get_run(run.info.run_id).info.status == "RUNNING"
    assert _history(file_store.as_uri(), run.info.run_id) == [(1, 2.5)]


def test_mlflow_folder_store_refused_plainly_without_the_opt_in(tmp_path, monkeypatch):
    import mlflow.environment_variables as env

    if not hasattr(env, "MLFLOW_ALLOW_FILE_STORE"):
        pytest.skip(f"MLflow {mlflow_version()} keeps folder stores without asking")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with pytest.raises(ValueError, match="MLFLOW_ALLOW_FILE_STORE=true"):
        open_sinks(f"mlflow:{tmp_path / 'mlruns'}")


def mlflow_version():
    import mlflow

    return mlflow.__version__


@pytest.mark.parametrize("log_to", ["wandb:runs", "jsonl", "runs/steps.jsonl", " jsonl:a.jsonl", 3,
                                    ["jsonl:a.jsonl", None], {"jsonl": "a.jsonl"}])
def test_an_unknown_form_is_refused_with_the_three_forms(log_to, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="'tensorboard:DIR', 'mlflow:URI' or 'jsonl:PATH'"):
        open_sinks(log_to)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("entry", ["jsonl:", "tensorboard:", "mlflow:", "jsonl:  "])
def test_an_empty_target_is_refused(entry):
    with pytest.raises(ValueError, match="empty after"):
        open_sinks(entry)


def test_the_same_target_twice_is_refused_before_anything_is_made(tmp_path):
    with pytest.raises(ValueError, match="twice"):
        open_sinks([f"jsonl:{tmp_path}/a/steps.jsonl", f"tensorboard:{tmp_path}/tb",
                    f"jsonl:{tmp_path}/a/../a/steps.jsonl"])
    assert list(tmp_path.iterdir()) == []


def test_a_target_that_cannot_be_written_is_refused_with_its_path(tmp_path):
    plain = tmp_path / "plain"
    plain.write_text("a file, not a folder")
    with pytest.raises(OSError, match=f"cannot write the file {plain}/x.jsonl"):
        open_sinks(f"jsonl:{plain}/x.jsonl")
    with pytest.raises(OSError, match=f"cannot write in the folder {plain}/tb"):
        open_sinks(f"tensorboard:{plain}/tb")
    with pytest.raises(ValueError, match=f"{plain} is a file, not a folder"):
        open_sinks(f"tensorboard:{plain}")
    with pytest.raises(OSError, match="Is a directory"):
        open_sinks(f"jsonl:{tmp_path}")
    # a sink opened before the one refused is closed again: its file is the only trace
    with pytest.raises(OSError):
        open_sinks([f"jsonl:{tmp_path}/first.jsonl", f"tensorboard:{plain}/tb"])
    assert (tmp_path / "first.jsonl").read_text() == ""


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        with pytest.raises(OSError, match="Permission denied"):
            open_sinks(f"tensorboard:{locked}")
        with pytest.raises(OSError, match="Permission denied"):
            open_sinks(f"jsonl:{locked}/steps.jsonl")
    finally:
        locked.chmod(0o700)


@pytest.mark.parametrize("package, extra", [("tensorboard", "tensorboard"), ("mlflow", "mlflow")])
def test_a_missing_package_says_the_pip_command_before_anything_is_made(package, extra, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, package, None)   # import fails as if not installed
    with pytest.raises(ImportError, match=rf"pip install 'tunekit\[{extra}\]'"):
        open_sinks([f"jsonl:{tmp_path}/steps.jsonl", f"{extra}:{tmp_path}/{extra}"])
    assert list(tmp_path.iterdir()) == []


def test_no_sinks():
    for log_to in (None, (), []):
        sinks = open_sinks(log_to)
        assert not sinks and repr(sinks) == "Sinks(none)"
        sinks.write(1, {"loss": 2.5})
        sinks.close()


def test_a_failing_sink_warns_once_and_is_dropped_while_the_others_go_on(tmp_path, monkeypatch):
    from torch.utils.tensorboard import SummaryWriter

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    sinks = open_sinks([f"tensorboard:{tmp_path}/tb", f"jsonl:{tmp_path}/steps.jsonl"])
    monkeypatch.setattr(SummaryWriter, "add_scalar", disk_full)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _write_steps(sinks)
        sinks.close()
    said = [str(w.message) for w in caught if w.category is RuntimeWarning]
    assert len(said) == 1 and "tensorboard:" in said[0] and "No space left on device" in said[0]
    assert [json.loads(line)["step"] for line in (tmp_path / "steps.jsonl").read_text().splitlines()] == [1, 2, 3]


def test_close_warns_for_a_sink_and_never_raises_and_a_second_close_does_nothing(tmp_path, monkeypatch):
    from torch.utils.tensorboard import SummaryWriter

    def gone(self):
        raise ConnectionError("server gone")

    sinks = open_sinks([f"tensorboard:{tmp_path}/tb", f"jsonl:{tmp_path}/steps.jsonl"])
    sinks.write(1, {"loss": 2.5})
    monkeypatch.setattr(SummaryWriter, "close", gone)
    with pytest.warns(RuntimeWarning, match="failed to close: ConnectionError: server gone"):
        sinks.close()
    assert not sinks
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sinks.close()
    assert len((tmp_path / "steps.jsonl").read_text().splitlines()) == 1


@pytest.mark.parametrize("step, metrics, error", [
    (-1, {"loss": 2.5}, ValueError), (1.5, {"loss": 2.5}, ValueError), (True, {"loss": 2.5}, ValueError),
    (1, {"loss": "2.5"}, TypeError), (1, {"loss": True}, TypeError), (1, {"loss": torch.ones(2)}, TypeError),
    (1, {3: 2.5}, TypeError), (1, [("loss", 2.5)], TypeError)])
def test_a_wrong_step_or_value_raises_before_any_sink_is_written(step, metrics, error, tmp_path):
    sinks = open_sinks(f"jsonl:{tmp_path}/steps.jsonl")
    with pytest.raises(error):
        sinks.write(step, metrics)
    sinks.close()
    assert (tmp_path / "steps.jsonl").read_text() == ""


def test_importing_the_module_imports_no_sink_package():
    code = ("import sys, tunekit.monitor.sinks; "
            "print([m for m in ('torch', 'tensorboard', 'mlflow') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_terminal_line_is_cleared_before_another_logger_prints(monkeypatch):
    # issue 33: the Monitor's line (redrawn with \r, no newline) ran into the Trainer's printed log
    import io

    from tunekit.monitor.view import MonitorView

    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    view = MonitorView("run", "terminal")
    view.update([], None)
    view.clear()
    assert err.getvalue().endswith("\r\x1b[K")   # the line erased, the cursor at its start
    lines = MonitorView("run", "lines")          # not a terminal: whole lines, nothing to clear
    lines.clear()
    assert err.getvalue().endswith("\r\x1b[K")


def test_steps_are_numbered_as_the_caller_says_and_every_sink_marks_warmup_and_counted(tmp_path):
    import tunekit

    model = torch.nn.Linear(8, 2)
    mon = tunekit.Monitor(model, live=False, peak=1.0, log_to=f"jsonl:{tmp_path / 's.jsonl'}")
    for step in (41, 42, 43):   # a run resumed at step 40, say
        mon.start_step(step=step)
        model(torch.randn(4, 8)).sum().backward()
        mon.end_step()
    mon.close()
    lines = [json.loads(x) for x in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert [r["step"] for r in mon.rows] == [x["step"] for x in lines] == [41, 42, 43]
    assert [(x["tunekit/counted"], x["tunekit/warmup"]) for x in lines] == [(1, 0), (0, 1), (0, 0)]
    assert all("tunekit/cpu_peak_bytes" in x for x in lines)   # every step written whole, once
    other = tunekit.Monitor(model, live=False)
    with pytest.raises(ValueError, match="step"):
        other.start_step(step=-1)
    other.close()
