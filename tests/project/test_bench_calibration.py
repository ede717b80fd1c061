"""benchmarks/bench_calibration.py leaves nothing behind (issue 39): each fresh cache folder it makes
for a child calibration is removed after it, also when Ctrl-C stops the child; and its per-round
profile of a pair's trials, on fake trial times (exact numbers)."""
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.helpers import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/bench_calibration.py")


@pytest.mark.parametrize("stop", [KeyboardInterrupt, None])
def test_a_childs_cache_folder_is_removed_after_it_also_on_ctrl_c(bench, monkeypatch, tmp_path, stop):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))   # where TemporaryDirectory makes its folders
    seen = []

    def run(cmd, env, **kw):
        folder = Path(env["TUNEKIT_CACHE"])
        (folder / "stream.json").write_text("{}")   # as a child's calibration writes it
        seen.append(folder)
        if stop is not None:
            raise stop()
        return subprocess.CompletedProcess(cmd, 0, stdout='{"steps": {}}\n', stderr="")

    monkeypatch.setattr(bench.subprocess, "run", run)
    if stop is None:
        assert bench.calibrated(False) == {"steps": {}}
    else:
        with pytest.raises(stop):
            bench.calibrated(False)
    assert len(seen) == 1 and seen[0].parent == tmp_path and list(tmp_path.iterdir()) == []


def test_a_pairs_profile_per_round_against_the_pairs_fastest(bench, capsys):
    # figure x: 2 rounds; the pair's fastest of it 1.0 (the busy cache's round 2). As is: rounds 1.2 and
    # 1.1 over 1.0; busy: 1.5, 1.0. Figure y likewise, its fastest 2.0: as is 2.4/2.0 = 1.2, 2.2/2.0 = 1.1
    def cache(x, y):
        return {"trials": {"x": x, "y": y, "cpu seconds": [3.0, 2.0]}, "steal": [(0.5, 10, 100), (1.0, 15, 200)]}

    bench.trial_profile({False: cache([1.2, 1.1], [2.4, 2.2]), True: cache([1.5, 1.0], [3.0, 2.0])})
    out = capsys.readouterr().out.splitlines()
    # as is: each figure at its fastest 1.1 (none within 5%); steal (15 - 10) / (200 - 100) = 5%;
    # CPU 3.0 s over 2.0 s of trials: 1.50
    assert out[0] == ("  as is: rounds' median trial / pair's fastest: 1.20 1.10; figures at their fastest: median "
                      "1.100, worst 1.10, 0 of 2 within 5%; MAMF tries median nan; steal 5.0%; CPU s per trial s 1.50")
    assert out[1].startswith("  busy: rounds' median trial / pair's fastest: 1.50 1.00; figures at their fastest: "
                             "median 1.000, worst 1.00, 2 of 2 within 5%")


def test_a_failed_child_says_why(bench, monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(bench.subprocess, "run", lambda cmd, env, **kw: subprocess.CompletedProcess(
        cmd, 1, stdout="", stderr="Traceback ...\nTypeError: keys must be str"))
    with pytest.raises(SystemExit, match="failed \\(1\\):\nTraceback ...\nTypeError: keys must be str"):
        bench.calibrated(False)
    assert list(tmp_path.iterdir()) == []
