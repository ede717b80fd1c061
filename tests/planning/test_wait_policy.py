"""A CPU plan says when its figures were calibrated under an OpenMP wait policy whose small matmuls
do not repeat (issue 39), and a record of another policy is not read as this process's."""
import json

import pytest

import tunekit
from tunekit.core.notes import of_kind
from tunekit.measure import stream
from tunekit.measure.conditions_gomp import PINNED, describe


def _plan():
    return tunekit.plan(tunekit.GPTConfig.preset("cpu-tiny"), "cpu", precision="fp32", micro_batch=4, seq_len=64)


def test_a_plan_from_a_default_policy_record_says_what_to_do(fixed_cpu):
    [note] = of_kind(_plan().notes, "expected.wait_policy")   # the fixture's record: libgomp's default
    assert "%env OMP_WAIT_POLICY=PASSIVE" in str(note)


def test_a_plan_from_a_pinned_record_has_no_such_note_and_the_same_figures(fixed_cpu, monkeypatch):
    before = _plan().expected.step_s
    path = fixed_cpu() / "stream.json"
    pinned = describe(PINNED)
    data = {k.replace("|omp default", f"|omp {pinned}"): {**v, "wait_policy": pinned}
            for k, v in json.loads(path.read_text()).items()}
    path.write_text(json.dumps(data))
    monkeypatch.setattr(stream, "policy", lambda: pinned)   # this process as if pinned
    p = _plan()
    assert not of_kind(p.notes, "expected.wait_policy") and p.expected.step_s == before


def test_a_record_of_another_policy_is_not_read(fixed_cpu, monkeypatch):
    monkeypatch.setattr(stream, "policy", lambda: describe(PINNED))
    with pytest.raises(AssertionError, match="was measured"):   # the fixture's sweeps refuse to run
        stream.measure_stream()
