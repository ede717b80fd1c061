"""A CPU calibration taken under one OpenMP wait policy is not read under another (issue 39): its
64-cube matmuls ran 1.3-10x apart (measure.conditions_gomp)."""
import pytest

from tunekit.measure import stream


def test_a_record_of_another_policy_is_not_read(fixed_cpu, monkeypatch):
    assert stream.measure_stream().wait_policy == "default"   # the fixture's record, this process's policy
    other = f"{stream.policy()} GOMP_SPINCOUNT=7"   # whatever this process runs under, another policy
    monkeypatch.setattr(stream, "policy", lambda: other)
    with pytest.raises(AssertionError, match="was measured"):   # the fixture's sweeps refuse to run
        stream.measure_stream()
