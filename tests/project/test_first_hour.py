"""The first hour of a new user (issue 33 item 4), from the wheel in a temporary venv:
`tools/first_hour.py` fails on a traceback, a warning, a negative or NaN figure, a note that
contradicts the run, a missing `pip install` command or a file written into the installed package
(the script's docstring lists each step and check). It passes on `make test`'s environment
(the [dev,hf] extras installed); it downloads nothing."""
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_first_hour_from_the_wheel_shows_nothing_wrong():
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "first_hour.py")], capture_output=True, text=True,
                         timeout=1500)   # three runs of chapter 18 among its steps
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    assert "0 finding(s)" in out.stdout


def _module():
    return load_script("tools/first_hour.py")


def _session(tmp_path):
    s = _module().Session(tmp_path)
    s.current = "scan"
    return s


@pytest.mark.parametrize("line, found", [
    ("  CPU RAM    RSS 0 B · peak -4.0 KiB", "negative figure"),          # issue 33's Monitor summary
    ("  time       -3.2 ms", "negative figure"),
    ("  speed      \u22121.5 TFLOPS · MFU 2%", "negative figure"),        # a typographic minus
    ("{'loss': '5.5', 'tunekit/mfu': nan}", "NaN figure"),
    ("  speed      NaN TFLOPS", "NaN figure"),
    ("/x/torch/utils.py:12: UserWarning: TypedStorage is deprecated", "warning"),
    ("Traceback (most recent call last):", "traceback"),
    ("  notes      torch.compile compiled 0 graph(s) during this run, so its time includes compiling",
     "note contradicts the run"),
    ("             recounted: train_step changed since the counted run", "note contradicts the run"),
    ("  CPU RAM    RSS -47.8 MiB · peak 0 B", None),    # the resident set's signed change: a drop is a reading
    ("  CPU RAM    RSS -0 B · peak 0 B", "negative zero"),
    ("  machine    run 2026-11-27 15:30, 1.5 of 2 CPUs", None),   # a date is no negative figure
    ("  memory     17.38 GiB of 79.20 GiB: fits (61.82 GiB free)", None),
    ("  MFU 0.0% · HFU 0.0% of 0.04379 TFLOPS", None),
    ("moved most: matmul/linear 83.3 ms -> 25.6 ms (-57.6 ms)", None),   # tunekit.diff's change: a reading
    ("peak memory 100.0 MiB -> 120.0 MiB (-20.0 MiB)", None),
    ("step 40.0 ms -> -25.0 ms (-15.0 ms)", "negative figure"),         # a side below zero is still wrong
])
def test_the_scan_finds_what_a_user_should_not_see_and_only_that(tmp_path, line, found):
    s = _session(tmp_path)
    s.scan(line)
    assert [what.split(":")[0] for _, what in s.findings] == ([found] if found else [])


def test_a_signed_error_column_may_be_negative_but_not_negative_zero(tmp_path):
    s = _session(tmp_path)
    table = ("  component          measured   estimated   error\n"
             "  activations       696.3 KiB   692.5 KiB     -1%\n"
             "  buffers                64 B         0 B   -100%\n")
    s.scan(table)
    assert s.findings == []
    s.scan(table + "  optimizer_states  898.6 KiB   898.5 KiB     -0%\n")
    assert [what.split(":")[0] for _, what in s.findings] == ["negative zero"]
    s.scan("  time       -3.2 ms   -1%\n")        # no error header above: both are wrong
    assert [what.split(":")[0] for _, what in s.findings] == ["negative zero", "negative figure"]


def test_a_file_written_into_the_installed_package_is_found(tmp_path):
    s = _session(tmp_path)
    s.site = tmp_path / "site"
    (s.site / "tunekit" / "__pycache__").mkdir(parents=True)
    (s.site / "tunekit" / "__init__.py").write_text("")
    s.before = _module().tree(s.site / "tunekit")
    (s.site / "tunekit" / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"")   # Python's, not tunekit's
    s.package_untouched()
    assert s.findings == []
    (s.site / "tunekit" / "calibration.json").write_text("{}")
    s.package_untouched()
    assert [what for _, what in s.findings] == ["written into the package: new: site-packages/tunekit/calibration.json"]
