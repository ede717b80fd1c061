"""Notes with kinds (tunekit.core.notes): a Note is its words as a str and a kind code reads;
kinds survive copies, pickles and the run log; no code of tunekit reads a note's words."""
import ast
import copy
import dataclasses
import json
import pathlib
import pickle

import pytest

from tunekit.core.notes import KINDS, Note, decoded, encoded, from_json, kind_of, of_kind, to_json, without
from tunekit.core.results import RunResult
from tunekit.lab.runlog import RunLog, append_record

ROOT = pathlib.Path(__file__).resolve().parents[2] / "tunekit"


# --- the type ----------------------------------------------------------------------------------------


def test_a_note_is_its_words_as_a_str_with_a_kind():
    n = Note("trial.oom", "OOM: CUDA out of memory")
    assert isinstance(n, str) and n.kind == "trial.oom" and kind_of(n) == "trial.oom"
    assert n == "OOM: CUDA out of memory" and hash(n) == hash("OOM: CUDA out of memory")
    assert "CUDA" in n and n.startswith("OOM") and {n: 1}["OOM: CUDA out of memory"] == 1
    # every view shows the words alone: no kind in a join, an f-string, a repr or JSON
    assert "; ".join([n, "b"]) == "OOM: CUDA out of memory; b" and f"{n}" == "OOM: CUDA out of memory"
    assert repr(n) == "'OOM: CUDA out of memory'" and json.dumps([n]) == '["OOM: CUDA out of memory"]'
    # str's methods give plain strings: changed words are no longer that note
    assert type(str(n)) is str and type(n.upper()) is str and type(n + "!") is str
    assert kind_of("a plain note") is None and kind_of(n.upper()) is None


@pytest.mark.parametrize("clone", [copy.copy, copy.deepcopy] + [
    (lambda p: lambda n: pickle.loads(pickle.dumps(n, p)))(p) for p in range(pickle.HIGHEST_PROTOCOL + 1)])
def test_a_note_keeps_its_kind_through_copies_and_pickles(clone):
    back = clone(Note("flops.uncounted", "not counted (no FLOP formula): aten.foo"))
    assert type(back) is Note and back.kind == "flops.uncounted"
    assert back == "not counted (no FLOP formula): aten.foo"


def test_a_dataclass_copied_to_a_dict_keeps_its_notes_kinds():
    # dataclasses.asdict deep-copies: the run log's path for a trace's notes
    @dataclasses.dataclass
    class Rec:
        notes: list

    copied = dataclasses.asdict(Rec([Note("rates.none", "x"), "y"]))["notes"]
    assert [kind_of(n) for n in copied] == ["rates.none", None]


def test_an_undeclared_kind_is_refused_where_it_is_written():
    with pytest.raises(ValueError, match=r"undeclared note kind\(s\) \['trial.oops'\]: declare them"):
        Note("trial.oops", "x")
    with pytest.raises(ValueError, match="undeclared"):
        Note(None, "x")          # a kind-less note is a plain str
    with pytest.raises(ValueError, match="undeclared"):
        of_kind([], "rates.nope")  # a filter's typo too
    with pytest.raises(ValueError, match="undeclared"):
        without([], "ckpt.not_aplied")


def test_every_kind_is_a_dotted_code_with_a_meaning():
    for kind, meaning in KINDS.items():
        assert kind == kind.lower() and "." in kind and " " not in kind, kind
        assert isinstance(meaning, str) and meaning, kind


def test_filters_read_kinds_and_keep_the_order_plain_strings_included():
    a, b, c = Note("memory.cpu", "a"), "memory.cpu", Note("ckpt.not_applied", "c")
    assert of_kind([a, b, c], "memory.cpu") == [a] and of_kind([a, b, c], "ckpt.not_applied", "memory.cpu") == [a, c]
    assert without([a, b, c], "memory.cpu") == [b, c] and without([a, b, c]) == [a, b, c]


# --- JSON and the run log ----------------------------------------------------------------------------


def test_json_keeps_a_note_as_its_kind_and_words():
    n = Note("device.assumed", "device='cpu' assumed")
    assert to_json(n) == {"kind": "device.assumed", "text": "device='cpu' assumed"} and to_json("plain") == "plain"
    back = from_json(json.loads(json.dumps(to_json(n))))
    assert type(back) is Note and back.kind == "device.assumed" and back == n
    # a kind a newer tunekit declared: the words stay, as a plain note
    assert type(from_json({"kind": "future.kind", "text": "w"})) is str
    nested = {"notes": [n, "p"], "trace": {"notes": (Note("trace.snapshot", "s"),)}}
    assert decoded(json.loads(json.dumps(encoded(nested))))["trace"]["notes"][0].kind == "trace.snapshot"


def test_kinds_survive_the_run_log_and_old_logs_still_load(tmp_path):
    path = tmp_path / "runs.jsonl"
    r = RunResult.from_dict({"label": "a", "notes": [Note("rates.none", "no TFLOPS"), "a plain note"],
                             "trace": {"seconds": {}, "wall_s": 1.0, "notes": [Note("trace.snapshot", "s")]}})
    RunLog(path).add(r)
    line = json.loads(path.read_text())
    assert line["notes"] == [{"kind": "rates.none", "text": "no TFLOPS"}, "a plain note"]
    back = RunLog.load(path)[0]
    assert [(type(n), kind_of(n), n) for n in back.notes] == [(Note, "rates.none", "no TFLOPS"),
                                                              (str, None, "a plain note")]
    assert back.trace["notes"][0].kind == "trace.snapshot"
    # a log written before kinds: plain strings, read as plain notes
    old = tmp_path / "old.jsonl"
    append_record(old, {"run_id": 0, "label": "b", "notes": ["OOM: x", "predicted over budget"]})
    assert RunLog.load(old)[0].notes == ["OOM: x", "predicted over budget"]
    # a note that is neither words nor a kind with its words is no record
    append_record(old, {"run_id": 1, "label": "c", "notes": [{"kind": "rates.none"}]})
    with pytest.warns(UserWarning, match="1 line"):
        assert len(RunLog.load(old)) == 1


def test_a_rank_s_result_file_keeps_the_kinds():
    # parallel/worker writes rank 0's result as JSON, launch reads it back with from_dict
    r = RunResult.from_dict({"label": "a", "notes": [Note("rates.none", "slowed")]})
    back = RunResult.from_dict(json.loads(json.dumps(encoded(r.to_dict()))))
    assert back.notes[0].kind == "rates.none" and back.notes == ["slowed"]


# --- no behaviour reads a note's words ---------------------------------------------------------------

NAMES = {"n", "note", "notes", "reason", "reasons", "why"}   # what a note, a trial's reason, is called
ATTRS = {"note", "notes", "reason"}                          # x.notes, t.reason, rec.notes[0]
READS = {"startswith", "endswith", "find", "rfind", "index", "count"}


def _noted(node) -> bool:
    while isinstance(node, ast.Subscript):
        node = node.value
    return (isinstance(node, ast.Name) and node.id in NAMES) or (isinstance(node, ast.Attribute) and node.attr in ATTRS)


def _words(node) -> bool:
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str)) \
        or (isinstance(node, ast.Tuple) and any(_words(e) for e in node.elts))


def word_reads(source: str) -> list:
    """The places in ``source`` that read the words of a note or a reason. Caught:

        n.startswith("checkpointing requested")      t.reason.startswith("OOM")
        rec.notes[0].endswith(")")                    note.find("peak")
        "TFLOPS" in n      "no CUDA device" not in note      "x" in rec.notes
        reason == "predicted over budget"             re.search("snapshot", n)

    where the note is a name in NAMES or an attribute in ATTRS. Not caught (none reads words):
    ``text not in self.notes`` (a note's dedup), ``cond.reason.split("; ")`` (a display's cut),
    ``op.startswith("flash_attn")`` (an op's name), ``kind_of(t.reason) == "trial.oom"``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            if f.attr in READS and _noted(f.value) or \
                    isinstance(f.value, ast.Name) and f.value.id == "re" and any(_noted(a) for a in node.args[1:2]):
                found.append(node)
        elif isinstance(node, ast.Compare):
            for left, op, right in zip([node.left, *node.comparators], node.ops, node.comparators):
                if isinstance(op, (ast.In, ast.NotIn)) and _words(left) and _noted(right) or \
                        isinstance(op, (ast.Eq, ast.NotEq)) and (_words(left) and _noted(right)
                                                                 or _words(right) and _noted(left)):
                    found.append(node)
    return [f"{node.lineno}: {ast.unparse(node)}" for node in found]


def test_the_scan_catches_what_its_docstring_says():
    bad = """
n.startswith("checkpointing requested")
t.reason.startswith("OOM")
rec.notes[0].endswith(")")
note.find("peak")
x = [n for n in notes if "TFLOPS" in n]
y = "no CUDA device" not in note
z = "x" in rec.notes
w = reason == "predicted over budget"
re.search("snapshot", n)
"""
    fine = """
if text not in self.notes: pass
cond.reason.split("; ")
op.startswith("flash_attn")
kind_of(t.reason) == "trial.oom"
"""
    assert len(word_reads(bad)) == 9 and word_reads(fine) == []


def test_no_code_of_tunekit_reads_a_note_s_words():
    found = [f"{p.relative_to(ROOT.parent)}:{hit}" for p in sorted(ROOT.rglob("*.py"))
             for hit in word_reads(p.read_text())]
    assert found == [], "behaviour keyed on a note's words: give the note a kind (tunekit.core.notes) and read that"
