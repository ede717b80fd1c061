"""A Ctrl-C in the last instructions of the outermost shield's ``__exit__``, after SIGINT is
Python's own handler again (tunekit/measure/interrupts.py): said as one that came inside (the
same note, no plain traceback of Python's), wherever in that window it lands."""
import signal
import sys

import pytest

from tests.measure.test_interrupts import no_leaked_exception  # noqa: F401 - the fixture, used by name
from tunekit.measure import interrupts
from tunekit.measure.interrupts import SECOND, deferred_interrupt

HELD = "tunekit: your Ctrl-C, held until what tunekit measures was whole, then raised here"
WINDOW = {f.__code__ for f in vars(deferred_interrupt).values() if hasattr(f, "__code__")}   # its methods


class Late:
    """Sends SIGINT at the k-th line event of the shield's ``__exit__`` (and what it calls there)
    that runs with Python's default handler in place: the window after the switch back."""

    def __init__(self, k):
        self.k, self.n, self.fired, self.exiting = k, 0, False, False

    def __enter__(self):
        sys.settrace(self.trace)

    def __exit__(self, *exc):
        sys.settrace(None)

    def trace(self, frame, event, arg):
        if frame.f_code not in WINDOW:
            return None
        self.exiting = self.exiting or frame.f_code is deferred_interrupt.__exit__.__code__
        python_s = signal.getsignal(signal.SIGINT) is signal.default_int_handler
        if self.exiting and event == "line" and python_s and not self.fired:
            self.n += 1
            if self.n > self.k:
                self.fired = True
                signal.raise_signal(signal.SIGINT)   # Python's own handler raises right here
        return self.trace


def sweep(block):
    """(what each k's delivery ended with) for every line of the window, from the first on."""
    ended, k = [], 0
    while True:
        late = Late(k)
        try:
            with late, deferred_interrupt("saving the record"):
                block()
        except BaseException as e:   # noqa: BLE001 - what the path ended with is what is judged
            ended.append(e)
        else:
            ended.append(None)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler and interrupts.innermost() is None
        if not late.fired:
            return ended[:-1]
        k += 1


def test_a_late_ctrl_c_after_a_quiet_path_is_raised_with_tunekit_s_note():
    before = sys.exception()   # a test before may leave one "handled" (settrace + signals): the context to expect
    ended = sweep(lambda: None)
    assert len(ended) >= 2   # the window holds several line events (each one tried)
    assert all(isinstance(e, KeyboardInterrupt) and e.__notes__ == [HELD] for e in ended)
    assert all(e.__context__ is before and e.__cause__ is None for e in ended)   # no plain one chained


def test_a_late_ctrl_c_while_the_first_travels_is_noted_on_the_first():
    def stopped():
        raise KeyboardInterrupt   # the first Ctrl-C, in the user's code
    ended = sweep(stopped)
    assert ended and all(type(e) is KeyboardInterrupt for e in ended)
    assert all(e.__notes__ == [SECOND.format(doing="saving the record")] for e in ended)


def test_a_late_ctrl_c_leaves_the_block_s_own_error_as_it_is():
    def failed():
        raise ValueError("the step's own")
    ended = sweep(failed)
    assert ended and all(type(e) is ValueError and not hasattr(e, "__notes__") for e in ended)


@pytest.mark.parametrize("k", [0, 1])
def test_a_ctrl_c_that_came_inside_and_a_late_one_raise_once(k):
    def inside():
        signal.raise_signal(signal.SIGINT)   # held by the shield until it ends
    late, before = Late(k), sys.exception()   # see the first test
    with pytest.raises(KeyboardInterrupt) as info:
        with late, deferred_interrupt():
            inside()
    assert info.value.__notes__ == [HELD] and info.value.__context__ is before
