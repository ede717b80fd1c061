"""tunekit.experiment outside a kernel (scripts, plain dict namespaces) and the report views."""
import sys

import pytest
import torch

import tunekit
from tunekit.core.summary import Summary


def test_experiment_in_a_script_namespace_frees_new_names_and_keeps_old_ones():
    ns = {"before": 1}
    with tunekit.experiment("script", namespace=ns, quiet=True) as exp:
        # 128 MiB: RSS sees it even where it reuses a hole in the heap, since the leak check
        # hands freed heap pages back before each reading (tests/measure/test_cpu_memory.py builds the hole)
        ns["tmp"] = torch.ones(32 * 2**20)
        ns["result"] = 3
        ns["before"] = 2                      # existed before: not deleted
        exp.keep("result")
    assert ns == {"before": 2, "result": 3}
    rec = exp.record
    assert rec is tunekit.last() and rec.name == "script"
    assert rec.exp_cpu_consumed_bytes > 120 * 2**20 and rec.exp_cpu_reclaimed_bytes > 120 * 2**20
    assert "freed variables: tmp" in rec.notes
    assert "Experiment memory" in exp.report_text   # ipyexperiments' own report, kept


def test_experiment_records_failures_and_reraises():
    ns = {}
    with pytest.raises(ZeroDivisionError):
        with tunekit.experiment("fails", namespace=ns, quiet=True):
            ns["x"] = 1
            ns["y"] = 1 / 0
    assert tunekit.last().error == "ZeroDivisionError: division by zero"
    assert ns == {}


def test_keep_takes_names():
    with pytest.raises(TypeError, match="names as strings"):
        with tunekit.experiment("k", namespace={}, quiet=True) as exp:
            exp.keep(42)


def test_summary_views():
    with tunekit.profile(name="views", flops="never"):
        pass
    s = Summary(tunekit.last())
    assert "views" in repr(s) and "time" in repr(s)
    html = s._repr_html_()
    assert html.startswith("<div") and "CPU RAM" in html
    assert "<table" in tunekit.last()._repr_html_()


def test_plot_history_has_three_panels():
    for bs in (2, 2):
        x = torch.randn(bs, 8)
        with tunekit.profile(name="p", inputs=(x,)):
            (x @ x.T).sum()
    fig = tunekit.profiling.plot_history()
    names = [t.name for t in fig.data]
    assert names[:2] == ["wall time", "CPU RSS peak"] and "TFLOPS" in names
    assert len(fig.data[0].x) == 2


def test_without_the_extra_the_error_names_the_install_command(monkeypatch):
    # ipyexperiments is the [experiments] extra: without it, one clear line before any work
    for name in ("ipyexperiments", "ipyexperiments.ipyexperiments"):
        monkeypatch.setitem(sys.modules, name, None)   # import of it fails as if not installed
    with pytest.raises(ModuleNotFoundError, match=r"\[experiments\] extra: pip install 'tunekit\[experiments\]'"):
        with tunekit.experiment("no extra"):
            pass
