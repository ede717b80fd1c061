"""tools/gpu_check.py (issue 32): its CPU dry run reports every section and writes both files, so
the GPU run is never spent on a typo; the runner records an overrun or an exception and goes on."""
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "gpu_check.py"


def load():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# not marked slow (17-30 s on 2 busy cores): `make test` is what keeps a typo off the lent GPU
def test_the_dry_run_reports_every_section_and_writes_both_files(tmp_path):
    # its own process, as `make gpu-check` runs it: IPython, ipywidgets and plotly are blocked there
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]   # 2: a section raised
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    md = (tmp_path / "gpu_check.md").read_text()
    gc = load()
    assert report["mode"] == "dry run (CPU)"
    assert [s["name"] for s in report["sections"]] == list(gc.SECTIONS)
    for s in report["sections"]:
        assert s["status"] in ("pass", "fail", "skipped"), (s["name"], s["reason"], s["tables"])
        assert s["checks"], s["name"]
        assert s["status"] != "skipped" or s["reason"], s["name"]
        for c in s["checks"]:
            assert c["result"] != "skipped" or c["note"], (s["name"], c["name"])
        assert f"## {s['name']}: {s['status']}" in md
    checks = {c["name"]: c for s in report["sections"] for c in s["checks"]}
    assert checks["notebook packages blocked"]["result"] == "pass"
    assert checks["FLOPs counted once, then reused"]["result"] == "pass"
    assert checks["fsdp over 1 rank (gloo) ran"]["result"] == "pass"


def test_an_overrun_is_skipped_with_its_reason_an_exception_is_an_error_and_the_rest_runs(tmp_path, monkeypatch):
    gc = load()

    def slow(run, sec):
        sec.check("before the overrun", 1, 1, True)
        sec.doing = "sleeping"
        time.sleep(5)

    def broken(run, sec):
        raise ValueError("a typo")

    def fine(run, sec):
        sec.check("a check", 2.0, 2.0, gc.within(2.0, 2.0, 0.0))

    funcs = {name: fine for name in gc.SECTIONS}
    funcs.update(device=slow, profile=broken)
    monkeypatch.setattr(gc, "FUNCS", funcs)
    monkeypatch.setattr(gc, "LIMITS_S", dict(gc.LIMITS_S, device=1))
    rc = gc.main(["--dry-run", "--out", str(tmp_path), "--only", "device,profile,monitor"])
    assert rc == 2   # a section raised
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    by = {s["name"]: s for s in report["sections"]}
    assert by["device"]["status"] == "skipped"
    assert by["device"]["reason"] == ("overran its 1 s limit in 'sleeping'; the checks done before: "
                                      "{'pass': 1, 'fail': 0, 'skipped': 0}")
    assert by["device"]["seconds"] < 3
    assert (by["profile"]["status"], by["profile"]["reason"]) == ("error", "ValueError: a typo")
    assert by["monitor"]["status"] == "pass"
    assert by["conditions"]["reason"] == "not asked for (--only)"
    # 8 sections: device skipped (its overrun), profile an error, monitor passed, the other 5 not asked for
    assert report["summary"] == {"pass": 1, "fail": 0, "skipped": 6, "error": 1, "pending": 0}
    assert "## profile: error (ValueError: a typo)" in (tmp_path / "gpu_check.md").read_text()
    import tunekit  # noqa: F401  (the blocker is gone: main() leaves the process as it found it)
    assert not any(type(f).__name__ == "_NoNotebook" for f in sys.meta_path)


def test_figures_are_json_safe_and_within_is_relative():
    gc = load()
    assert gc.clean({"a": float("nan"), "b": [1, float("inf")], "c": (2.5,)}) == {"a": None, "b": [1, None],
                                                                                 "c": [2.5]}
    assert gc.within(105, 100, 0.05) is True     # |105/100 - 1| = 0.05
    assert gc.within(106, 100, 0.05) is False    # 0.06 > 0.05
    assert gc.within(float("nan"), 100, 0.05) is None
    assert gc.within(1, 0, 0.05) is None


def test_a_section_whose_checks_were_all_skipped_is_skipped_and_says_why():
    gc = load()
    sec = gc.Section("plan")
    sec.skip("x", "no CUDA")
    sec.skip("y", "no CUDA")
    sec.finish()
    assert (sec.status, sec.reason) == ("skipped", "every check was skipped: no CUDA")
    sec = gc.Section("lab")
    sec.check("ok", 1, 1, True)
    sec.check("bad", 1, 2, False)
    sec.finish()
    assert sec.status == "fail"
