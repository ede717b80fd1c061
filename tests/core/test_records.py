"""`ProfileRecord` is slotted (one is kept per profiled cell): it still pickles, copies and
converts as a dataclass, and takes no attribute that is not one of its fields."""
import copy
import dataclasses
import math
import pickle

import pytest

from tunekit.core.records import COLUMNS, ProfileRecord


def _same(a, b) -> bool:
    """Field by field, NaN equal to NaN (a pickled NaN is another float object)."""
    def eq(x, y):
        return (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)) or x == y

    return all(eq(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(ProfileRecord))


def test_a_record_has_no_instance_dict_and_refuses_a_name_that_is_not_a_field():
    rec = ProfileRecord(name="In[3]", wall_s=0.25, notes=["a note"])
    assert not hasattr(rec, "__dict__")
    with pytest.raises(AttributeError):
        rec.not_a_field = 1


def test_a_record_pickles_copies_and_converts_as_before():
    rec = ProfileRecord(name="In[3]", wall_s=0.25, flops=1e9, device="cpu", notes=["a note"])
    for other in (pickle.loads(pickle.dumps(rec)), copy.copy(rec), copy.deepcopy(rec), dataclasses.replace(rec)):
        assert type(other) is ProfileRecord and _same(other, rec)
    assert copy.copy(rec).notes is rec.notes and copy.deepcopy(rec).notes is not rec.notes
    d = rec.to_dict()
    assert (d["name"], d["wall_s"], d["flops"], d["notes"]) == ("In[3]", 0.25, 1e9, "a note")
    assert set(d) == set(COLUMNS)
    assert ProfileRecord(name="x").notes is not ProfileRecord(name="y").notes  # a list of its own each
