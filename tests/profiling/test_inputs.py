"""`fingerprint.cell_inputs` answers a one-line binding from its text: the same answer as the parse."""
import pytest

from tunekit.profiling import fingerprint


@pytest.mark.parametrize("source, read, inert, fast", [
    ("x = 1", set(), True, True),
    ("x = 1\n", set(), True, True),
    ("lr=3e-4", set(), True, True),
    ("x = 1.", set(), True, True),
    ("x = y", {"y"}, True, True),
    ("x = x", {"x"}, True, True),          # read before it is bound: an input
    ("x = None\n", set(), True, True),     # a constant, not a name
    ("x = match", {"match"}, True, True),  # a soft keyword is a name
    ("x = 08", set(), False, False),       # not Python: parsed, and nothing known
    ("if = 1", set(), False, False),       # a keyword: parsed (and refused)
    ("x = lambda", set(), False, False),
    (" x = 1", set(), False, False),       # indented: not Python
    ("x = 1_000", set(), True, False),     # shapes the pattern leaves to the parse
    ("x = -1", set(), True, False),
    ("x = 1 # c", set(), True, False),
    ("x = y\ny = 2", {"y"}, True, False),
])
def test_a_one_line_binding_is_answered_as_the_parse_answers(source, read, inert, fast, monkeypatch):
    parsed = fingerprint.names_read(source), fingerprint.runs_nothing(source)
    assert parsed == (frozenset(read), inert)
    if fast:  # answered from the text: the parse, made to fail loudly, is never asked
        monkeypatch.setattr(fingerprint, "names_read", lambda s: pytest.fail(f"parsed {s!r}"))
        monkeypatch.setattr(fingerprint, "runs_nothing", lambda s: pytest.fail(f"parsed {s!r}"))
    assert fingerprint.cell_inputs(source)[:2] == parsed


@pytest.mark.parametrize("source, namespace, little", [
    ("x = 1", {}, True),                            # a new name
    ("x = 1", {"x": 2.5}, True),                     # a number released
    ("x = y", {"x": "s", "y": [0] * 10}, True),      # y's list shared, not made
    ("x = 1", {"x": [0]}, False),                    # a list released: may be large
    ("x = 1", {"x": "s" * 2**20}, False),            # a string of 1 MiB released
    ("x = 1", {"x": 1 << 2**25}, False),             # an int of 2**25 + 1 bits (4 MiB) released
    ("x = f()", {}, False),                          # a call: anything
    ("x = 1\ny = 2", {}, False),                     # not a one-line binding
])
def test_allocates_little_only_for_a_binding_that_makes_and_releases_nothing_large(source, namespace, little):
    assert fingerprint.cell_inputs(source, namespace)[2] is little
