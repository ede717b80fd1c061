"""A refusal from a public entry point reaches an IPython user as their line and the message
(tunekit.core.refusals): no tunekit frame in the traceback text, the whole traceback kept on the
exception."""
import re
import traceback

import pytest

pytest.importorskip("IPython")

from IPython.utils.capture import capture_output  # noqa: E402

from tunekit.core.refusals import is_refusal, user_facing  # noqa: E402


def _shown(shell, cell: str) -> tuple[str, BaseException]:
    """The traceback text IPython prints for ``cell`` and the exception it raised."""
    with capture_output() as cap:
        result = shell.run_cell(cell)
    return re.sub(r"\x1b\[[0-9;]*m", "", cap.stdout + cap.stderr), result.error_in_exec


@pytest.fixture
def shell(shell):
    """conftest's shell (left as found) with a Lab in it."""
    shell.run_cell("import tunekit\nlab = tunekit.Lab()")
    yield shell
    for name in ("lab", "mine", "entry", "fails"):
        shell.user_ns.pop(name, None)


@pytest.mark.parametrize("cell, message", [
    ('tunekit.plan("gpt2-124m", device="H1000")', "unknown device 'H1000'"),
    ('tunekit.plan("gpt2-124m", precison="bf16")', "did you mean precision='bf16'?"),
    ('tunekit.plan("gpt2-124m", micro_batch=0)', "micro_batch must be a whole number >= 1"),
    ("tunekit.explain(42)", "got int 42"),
    ('tunekit.Lab("gpt2-124m")', "did you mean preset='gpt2-124m'?"),
    ("lab.run(steps=0)", "steps must be a whole number >= 1"),
    ('lab.run(precision="fp7")', "precision must be one of"),
    ('lab.plan("H1000")', "unknown device 'H1000'"),
    ("lab.find_max_batch_size(start=4, limit=2)", "need whole numbers 1 <= start <= limit"),
    ("lab.expect(micro_batch=10**6)", "does not fit"),
    ("tunekit.estimate_memory(n_params=-1)", "n_params must be a finite number >= 1"),
    ("tunekit.diff(1, 2)", "got int"),
    ('tunekit.advise(lab.model, micro_batch=0)', "micro_batch"),
])
def test_a_refusal_shows_the_users_line_and_the_message(shell, cell, message):
    text, error = _shown(shell, f"def mine():\n    {cell}\nmine()")
    assert message in text
    files = [line for line in text.splitlines() if line.lstrip().startswith("File ")]
    # the cell's two lines (the call of mine(), the line inside it), nothing of tunekit's nor IPython's
    assert len(files) == 2 and not any("tunekit" in f or "IPython" in f for f in files), text
    assert f"    {cell}" in text.splitlines()
    # the exception itself keeps every frame (%debug, traceback.print_exception)
    assert any("tunekit" in f.filename for f in traceback.extract_tb(error.__traceback__))


def test_what_is_no_refusal_keeps_its_frames(shell):
    """A failure that is not tunekit's own `raise` (here the user's function, called by a decorated
    entry point) is shown as IPython shows any exception: with its frames."""
    shell.user_ns["entry"] = user_facing(lambda f: f())
    text, error = _shown(shell, "def fails():\n    return {}['x']\nentry(fails)")
    assert not is_refusal(error) and not hasattr(error, "_render_traceback_")
    # its frames: the cell, the user's function (the entry point's own frame hidden, as IPython hides it)
    assert "in fails()" in text and "return {}['x']" in text and "skipping hidden 1 frame" in text
