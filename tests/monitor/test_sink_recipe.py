"""docs/ARCHITECTURE.md's recipe "a sink", followed as it says: one class with ``__init__(entry,
target, package)``, ``write(step, figures, now)`` and ``close()``, its scheme in
``monitor.sinks.OPENERS``; then ``Monitor(model, log_to="SCHEME:TARGET")`` writes to it, nothing
else changed."""
import pathlib
import re

import torch

import tunekit
from tunekit.monitor import sinks

ROOT = pathlib.Path(__file__).resolve().parents[2]


class Recorder:
    """The recipe's sink: it keeps what it is given."""
    opened: list = []

    def __init__(self, entry, target, package):
        self.name, self.target, self.package = entry, target, package
        self.lines, self.closed = [], False
        Recorder.opened.append(self)

    def write(self, step, figures, now):
        self.lines.append((step, figures))

    def close(self):
        self.closed = True


def test_a_sink_added_as_the_recipe_says_gets_a_monitors_steps(monkeypatch, tmp_path):
    monkeypatch.setitem(sinks.OPENERS, "recorder", Recorder)   # the recipe's one line
    Recorder.opened = []
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # peak given and flops="never": no CPU calibration, no FLOP counting, every step measured
    mon = tunekit.Monitor(model, log_to=f"recorder:{tmp_path / 'rec'}", peak=1.0, flops="never", warmup=0,
                          samples=8, live=False)
    for _ in range(3):
        with mon.step():
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.log(loss=loss)
    mon.close()
    (sink,) = Recorder.opened
    assert sink.name == f"recorder:{tmp_path / 'rec'}" and sink.target == (tmp_path / "rec").resolve()
    assert sink.package is None and sink.closed
    assert [step for step, _ in sink.lines] == [0, 1, 2]
    for _, figures in sink.lines:   # every figure under tunekit/, the user's loss among them
        assert {"tunekit/loss", "tunekit/wall_s", "tunekit/samples_per_s"} <= set(figures)
        assert figures["tunekit/samples_per_s"] == 8 / figures["tunekit/wall_s"]


def test_the_recipe_names_what_the_test_uses():
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    row = next(line for line in doc.splitlines() if line.startswith("| a sink "))
    for name in ("OPENERS", "write(step, figures, now)", "close()", "_load", "EXTRAS",
                 "tests/monitor/test_sink_recipe.py"):
        assert name in row, name
    assert re.search(r"`tunekit/monitor/sinks\.py`", row)
