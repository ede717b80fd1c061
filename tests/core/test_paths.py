"""Where tunekit writes (issue 19): the platform's user folders, overridable, never the package;
run logs one a day and findable; traces, snapshots and charts capped, saying what was removed."""
import os
import pathlib
import sys
import time
from pathlib import Path

import pytest

from tunekit.core import paths
from tunekit.core.results import RunResult
from tunekit.core.toggles import Toggles
from tunekit.lab.runlog import RunLog, read_records

HOME = "/home/ada"


@pytest.mark.parametrize("platform,env,data,cache", [
    ("linux", {}, f"{HOME}/.local/share/tunekit", f"{HOME}/.cache/tunekit"),
    ("linux", {"XDG_DATA_HOME": "/xdg/data", "XDG_CACHE_HOME": "/xdg/cache"},
     "/xdg/data/tunekit", "/xdg/cache/tunekit"),
    # the XDG spec: a relative path is invalid and ignored; empty is unset
    ("linux", {"XDG_DATA_HOME": "rel/data", "XDG_CACHE_HOME": ""},
     f"{HOME}/.local/share/tunekit", f"{HOME}/.cache/tunekit"),
    ("freebsd14", {"XDG_CACHE_HOME": "/c"}, f"{HOME}/.local/share/tunekit", "/c/tunekit"),
    ("darwin", {"XDG_DATA_HOME": "/ignored"}, f"{HOME}/Library/Application Support/tunekit",
     f"{HOME}/Library/Caches/tunekit"),
    ("win32", {}, f"{HOME}/AppData/Local/tunekit", f"{HOME}/AppData/Local/tunekit/Cache"),
    ("win32", {"LOCALAPPDATA": r"C:\Users\ada\AppData\Local"}, r"C:\Users\ada\AppData\Local/tunekit",
     r"C:\Users\ada\AppData\Local/tunekit/Cache"),
    ("win32", {"LOCALAPPDATA": r"relative\dir"},
     f"{HOME}/AppData/Local/tunekit", f"{HOME}/AppData/Local/tunekit/Cache"),
])
def test_user_dirs_per_platform(platform, env, data, cache):
    assert paths.user_dirs(platform, env, HOME) == (Path(data), Path(cache))


def test_overrides_then_the_user_folders(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    for k in ("TUNEKIT_DATA_DIR", "TUNEKIT_CACHE", "XDG_DATA_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(k, raising=False)
    assert paths.data_dir() == tmp_path / ".local" / "share" / "tunekit"
    assert paths.cache_dir() == tmp_path / ".cache" / "tunekit"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xc"))
    assert paths.cache_dir() == tmp_path / "xc" / "tunekit"
    monkeypatch.setenv("TUNEKIT_DATA_DIR", "~/mine")
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path / "c"))
    assert paths.data_dir() == tmp_path / "mine" and paths.cache_dir() == tmp_path / "c"
    assert (paths.runs_dir(), paths.traces_dir(), paths.figures_dir()) == (
        tmp_path / "mine" / "runs", tmp_path / "mine" / "traces", tmp_path / "mine" / "figures")
    monkeypatch.setenv("TUNEKIT_DATA_DIR", "")  # set but empty: as if unset
    assert paths.data_dir() == tmp_path / ".local" / "share" / "tunekit"
    from tunekit.measure import peaks
    from tunekit.models import data

    assert peaks.cache_dir() == tmp_path / "c"  # one resolver: calibrations and the corpus
    assert data.corpus_path().parent == tmp_path / "c"


def _files(folder, names, start=1_000_000_000):
    for i, name in enumerate(names):  # mtimes 10 s apart, in the order given
        p = folder / name
        p.write_text(name)
        os.utime(p, (start + 10 * i, start + 10 * i))


def test_prune_keeps_the_newest_and_says_what_it_removed(tmp_path):
    _files(tmp_path, ["b.json", "a.json", "c.json", "d.json", "keep.txt"])
    removed = paths.prune(tmp_path, "*.json", keep=2)
    assert removed == [tmp_path / "b.json", tmp_path / "a.json"]  # oldest first, by time not by name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.json", "d.json", "keep.txt"]
    assert paths.pruned_note(removed, "Chrome traces", 2) == (
        f"removed 2 older Chrome traces from {tmp_path} (tunekit keeps the newest 2): b.json, a.json")
    assert paths.prune(tmp_path, "*.json", keep=2) == [] and paths.pruned_note([], "charts", 2) is None
    assert paths.prune(tmp_path / "missing", "*.json", keep=0) == []
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="keep must be an int >= 0"):
            paths.prune(tmp_path, "*.json", keep=bad)


def test_traces_are_capped_in_tunekit_folder_and_left_alone_in_yours(monkeypatch, tmp_path):
    import torch

    from tunekit.measure.trace import Tracer

    monkeypatch.setenv("TUNEKIT_DATA_DIR", str(tmp_path))
    folder = tmp_path / "traces"
    folder.mkdir()
    old = [f"old-{i:02d}.json" for i in range(paths.KEEP_TRACES)]
    _files(folder, old + ["notes.txt"])
    x = torch.randn(16, 16)
    tracer = Tracer("small", trace=True).start()
    x @ x
    bd, _ = tracer.stop(0.01)
    assert Path(bd.path).parent == folder and Path(bd.path).exists()
    assert f"removed 1 older Chrome traces from {folder} (tunekit keeps the newest 20): old-00.json" in bd.notes
    assert sorted(p.name for p in folder.iterdir()) == sorted(old[1:] + ["notes.txt", Path(bd.path).name])
    mine = tmp_path / "mine"
    mine.mkdir()
    _files(mine, old)
    tracer = Tracer("small", trace=True, folder=mine).start()
    x @ x
    bd, _ = tracer.stop(0.01)
    assert len(list(mine.glob("*.json"))) == paths.KEEP_TRACES + 1 and not any("removed" in n for n in bd.notes)


def test_snapshots_are_capped_saying_what_went(monkeypatch, tmp_path):
    from tunekit.measure import torch_private, trace

    monkeypatch.setenv("TUNEKIT_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(torch_private, "cuda_memory_snapshot", lambda p: pathlib.Path(p).write_text("x") and str(p))
    folder = tmp_path / "traces"
    folder.mkdir()
    _files(folder, [f"s{i}.pickle" for i in range(paths.KEEP_SNAPSHOTS)])
    path, why_not = trace.save_snapshot("oom-mb4")
    assert why_not is None and Path(path).parent == folder and Path(path).name.startswith("oom-mb4-")
    assert trace.prune_snapshots() == (
        f"removed 1 older memory snapshots from {folder} (tunekit keeps the newest 5): s0.pickle")
    (tmp_path / "file.txt").write_text("")
    path, why_not = trace.save_snapshot("x", folder=tmp_path / "file.txt" / "sub")  # a folder under a file
    assert path is None and why_not.startswith("no memory snapshot: [Errno 20] Not a directory")


def _failed(label="baseline"):
    return RunResult.failed(Toggles(), label, "not run: a record for the log test", [])


def test_a_days_log_is_shared_each_lab_numbering_its_own_runs_from_0(tmp_path):
    day = tmp_path / "lab-2025-06-01.jsonl"
    a, b = RunLog(day, session="a"), RunLog(day, session="b")
    a.add(_failed("a0")), b.add(_failed("b0")), a.add(_failed("a1"))
    assert [(r.run_id, r.label, r.session) for r in a.runs] == [(0, "a0", "a"), (1, "a1", "a")]
    assert [(r.run_id, r.session) for r in b.runs] == [(0, "b")]
    records, _ = read_records(day)
    assert [(r["run_id"], r["label"], r["session"]) for r in records] == [
        (0, "a0", "a"), (0, "b0", "b"), (1, "a1", "a")]
    later = RunLog(day, session="c")  # a new Lab starts empty, the file keeps everything
    assert later.runs == [] and later.add(_failed()).run_id == 0
    named = RunLog(day)  # a log named by the user is resumed whole: ids unique in the file
    assert len(named.runs) == 4 and named.add(_failed("named")).run_id == 2


def test_lab_logs_to_the_day_file_and_load_results_finds_it(monkeypatch, tmp_path):
    from tunekit import Lab

    monkeypatch.setenv("TUNEKIT_DATA_DIR", str(tmp_path))
    lab1, lab2 = Lab(peak_tflops=1.0), Lab(peak_tflops=1.0)
    day = tmp_path / "runs" / f"lab-{time.strftime('%Y-%m-%d')}.jsonl"
    assert lab1.log_path == lab2.log_path == day and lab1.log.session != lab2.log.session
    lab1.log.add(_failed("one")), lab2.log.add(_failed("two"))
    df = Lab.load_results(all=True)
    assert list(df["label"]) == ["one", "two"] and list(df["run_id"]) == [0, 0]
    assert list(df["session"]) == [lab1.log.session, lab2.log.session]
    assert [r.label for r in lab2.runs] == ["two"]


def test_python_path_keeps_this_interpreters_order_and_makes_relative_entries_absolute(monkeypatch, tmp_path):
    # a child process gets this sys.path in its order: the standard library ahead of site-packages (a
    # site-packages folder put first could shadow the standard library with a same-named package), the
    # current folder ('' and a relative entry) made absolute, since the child may start elsewhere
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["", "/usr/lib/python3.11", "/venv/site-packages", "models"])
    assert paths.python_path().split(os.pathsep) == [
        str(tmp_path), "/usr/lib/python3.11", "/venv/site-packages", str(tmp_path / "models")]


def test_first_use_children_get_that_path(monkeypatch):
    from tunekit.measure import first_use

    seen = []

    class Child:
        returncode = 1

        def __init__(self, argv, env, **kwargs):
            seen.append(env["PYTHONPATH"])

        def communicate(self, timeout=None):
            return "", ""

    monkeypatch.setattr(first_use.subprocess, "Popen", Child)
    assert first_use.measure_child(["float32"], threads=1, repeats=2) == {"float32": []}   # both failed: left out
    assert seen == [paths.python_path()] * 2
