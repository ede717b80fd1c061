"""Ctrl-C that cannot tear measurement state. Measurement layer.

Installing or removing a FLOP counter (a torch dispatch mode plus module hooks), a memory meter,
a profiler or an IPython hook takes several lines; a KeyboardInterrupt between two of them
would leave the process measuring forever (every later op slowed, every later timing wrong) or
lose the record. So a whole entry/exit path runs inside ``deferred_interrupt()``: a SIGINT
there is only remembered, and raised once the path is consistent again. Only the user's code
runs interruptible, inside the shield's ``gate()``, which must sit in a ``try`` whose handler
cleans up::

    with deferred_interrupt() as shield:
        install()
        try:
            with shield.gate():          # a Ctrl-C that came during install() is raised here
                user_code()
        finally:
            uninstall()                  # a second Ctrl-C waits until this is done

Shields nest: an inner one hands a remembered Ctrl-C to an outer one whose gate is shut, and
raises it where the outer gate is open (inside the user's code of the outer path).

While a gate is open, a signal that lands in a frame of tunekit shuts the gate as it raises, so
the clean-up that the KeyboardInterrupt is travelling to cannot be cut short by a second Ctrl-C;
one that lands in the user's code leaves it open (code that catches KeyboardInterrupt and goes
on stays interruptible). Two kinds of tunekit functions are told apart by their code objects:
``closes_gate`` functions run their gate shut from their first instruction (a ``__exit__`` or an
IPython hook that ends a gate opened before it was called), ``opens_gate`` ones leave it open
when they raise (a hook whose KeyboardInterrupt IPython swallows before running the cell).

What an observer runs inside the user's code (a dispatch mode's handler: torch's FLOP counter
pushes and pops itself around a decomposition there) is no user's code either: ``held(fn)`` runs
it with the gate shut, and a Ctrl-C meanwhile is raised as it returns.

A second Ctrl-C while the first's KeyboardInterrupt travels through tunekit to its clean-up
(the record being saved, a run being undone) waits like one during any clean-up, also where
the gate is still open; it never starts a second traceback from inside tunekit. It stops
nothing more (the first is stopping everything already): the first's exception gets a note
``tunekit: second Ctrl-C: stopped while saving the record of In[3] ...`` (the shield's
``doing``). Should the clean-up end without an exception, the second is raised, as any.

A Ctrl-C in the last instructions of the outermost shield, after SIGINT is Python's own handler
again, is taken as one that came inside (raised with the same note, or noted on the first's
exception travelling), not shown as a plain KeyboardInterrupt of Python's.

Outside the main thread (no signals there), and while SIGINT has a handler other than Python's
default (a debugger's, the user's own, SIG_IGN), a shield does nothing.
"""
from __future__ import annotations

import _signal  # signal's own calls without the enum round trips (see innermost)
import os
import signal
import sys
import threading

_TUNEKIT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_CLOSERS: set = set()
_OPENERS: set = set()


def closes_gate(fn):
    """Mark ``fn`` as ending a gate: a SIGINT that lands in it waits (``fn`` shuts the gate first)."""
    _CLOSERS.add(fn.__code__)
    return fn


def opens_gate(fn):
    """Mark ``fn`` as opening a gate that stays open after it returns: its KeyboardInterrupt
    leaves the gate open."""
    _OPENERS.add(fn.__code__)
    return fn


def _code(tracer):
    return getattr(getattr(tracer, "__func__", tracer), "__code__", None)


def _landing(frame):
    """The frame a signal interrupted. A trace function (a debugger's, coverage's, the tests'
    injector) runs in a frame of its own: the frame it was tracing is the one that counts."""
    if frame is not None and frame.f_back is not None and frame.f_code in (
            _code(sys.gettrace()), _code(frame.f_back.f_trace)):
        return frame.f_back
    return frame


def _shield_of(handler):
    """The shield whose handler ``handler`` is, or None."""
    shield = getattr(handler, "__self__", None)
    return shield if isinstance(shield, deferred_interrupt) else None


def innermost():
    """The innermost active shield (its handler is SIGINT's), or None.

    Shields call `_signal`, which `signal.getsignal`/`signal.signal` wrap: those turn every
    handler they take or return into a Handlers enum, which fails (raising inside) for a Python
    handler, several µs a call and a dozen calls a profiled cell. `_signal` returns the handler
    as is (SIG_DFL/SIG_IGN as the ints the enums equal)."""
    return _shield_of(_signal.getsignal(signal.SIGINT))


class deferred_interrupt:
    """Context manager: SIGINT is remembered inside, raised at the end (or at the next
    ``gate()``); see the module docstring. ``pending``: a Ctrl-C is waiting.

    Each active shield is SIGINT's handler in turn, and ``previous`` is the one it replaced (the
    enclosing shield's, or Python's default): installing or removing one is a single switch, so
    no Ctrl-C can find the chain half-changed."""

    def __init__(self, doing: str | None = None):
        self.pending = self.open = self.active = False
        self.previous = None
        self.handled = None  # the exception being handled when the gate last opened (`_handle`)
        self.doing = doing  # what its clean-up does, for a second Ctrl-C's note (`second_ctrl_c`)

    @property
    def outer(self):
        return _shield_of(self.previous)

    def __enter__(self) -> "deferred_interrupt":
        if threading.current_thread() is not threading.main_thread():
            return self
        now = _signal.getsignal(signal.SIGINT)
        if now is not signal.default_int_handler and _shield_of(now) is None:
            return self  # someone else's handler (a debugger's, the user's, SIG_IGN): leave SIGINT alone
        self.active = True
        self.previous = _signal.signal(signal.SIGINT, self._handle)  # a SIGINT before the switch is `now`'s
        return self

    @closes_gate  # called with the gate open (an IPython hook's shield): shut it before a Ctrl-C can cut in
    def __exit__(self, etype, exc, tb) -> bool:
        if not self.active:
            return False
        self.active = self.open = False
        outer = self.outer
        try:
            if _signal.getsignal(signal.SIGINT) == self._handle:
                _signal.signal(signal.SIGINT, self.previous)  # a SIGINT before the switch lands in self.pending
            else:  # ended out of order (an IPython hook's shield), or the user's code replaced the handler
                self._splice()
            return self._hand_on(outer, etype, exc, self.pending)
        except KeyboardInterrupt as e:
            if getattr(e, "_tunekit_held", False):
                raise
            # Python's own handler's, in the instructions after the outermost shield handed SIGINT
            # back: everything is whole already, so it is taken as one that came inside (handed on
            # past this block: not chained to Python's plain KeyboardInterrupt)
        return self._hand_on(outer, etype, exc, True)

    def _hand_on(self, outer, etype, exc, pending: bool) -> bool:
        """``__exit__``'s end, SIGINT's handler switched back: a Ctrl-C that came (``pending``) to
        the enclosing shut path, raised, or noted on the first Ctrl-C's exception travelling."""
        if pending:
            self.pending = False
            if outer is not None and outer.active and not outer.open:
                outer.pending = True   # the outer path raises it when it is consistent
                outer.doing = outer.doing or self.doing
            elif etype is None:
                raise _held()
            elif issubclass(etype, KeyboardInterrupt) and exc is not None:
                second_ctrl_c(exc, self.doing)  # the first is stopping everything: said on it
        return False  # an exception of the block wins over a Ctrl-C that came meanwhile

    def _splice(self):
        inner = innermost()
        while inner is not None and inner.previous != self._handle:
            inner = inner.outer
        if inner is not None:
            inner.previous = self.previous
            inner.pending = inner.pending or self.pending
            self.pending = False

    def _handle(self, signum, frame):
        if not self.open:
            self.pending = True
            return
        frame = _landing(frame)
        code = frame.f_code if frame is not None else None
        if code in _CLOSERS:
            self.pending = True
            return
        handled = sys.exc_info()[1]
        if code not in _OPENERS and code is not None and code.co_filename.startswith(_TUNEKIT) \
                and isinstance(handled, KeyboardInterrupt) and handled is not self.handled:
            # a second Ctrl-C while the first travels through tunekit to its clean-up: it waits (one
            # handled already when the gate opened is none: the user's `except KeyboardInterrupt:`
            # block around the call, or one CPython left marked as handled)
            self.open, self.pending = False, True
            return
        if code not in _OPENERS and code is not None and code.co_filename.startswith(_TUNEKIT):
            self.open = False
        raise _held("raised at once by tunekit's handler, in the frame above")

    def gate(self) -> "_Gate":
        """Context manager: SIGINT raises at once inside (and a remembered one on entry)."""
        return _Gate(self)


class _Gate:
    __slots__ = ("shield",)

    def __init__(self, shield):
        self.shield = shield

    def __enter__(self):
        s = self.shield
        s.handled, s.open = sys.exc_info()[1], True
        if _take_pending(s):  # a Ctrl-C from the set-up: raised before the user's code starts
            s.open = False
            raise _held()

    def __exit__(self, *exc):
        self.shield.open = False


def _take_pending(shield) -> bool:
    """Whether a Ctrl-C waits in ``shield`` or in the shut shields around it (the enclosing
    paths' set-up), taking it: it is about to be raised."""
    found = False
    while shield is not None and shield.active:
        found, shield.pending = found or shield.pending, False
        shield = shield.outer
        if shield is not None and shield.open:  # beyond: the user's code of an outer path
            break
    return found


def held(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with the innermost gate shut if it is open (an observer's callback
    inside the user's code): a Ctrl-C meanwhile waits until ``fn`` is done, then is raised, the
    gate left shut as when one lands in tunekit (the clean-up it travels to follows)."""
    shield = innermost() if threading.current_thread() is threading.main_thread() else None
    if shield is None or not shield.open:  # held already (a shut gate, nested), or not ours to hold
        return fn(*args, **kwargs)
    shield.open = False
    try:
        out = fn(*args, **kwargs)
    except BaseException as e:
        shield.open = True
        if shield.pending:  # the Ctrl-C wins: the user's code, which might catch `e`, must stop
            shield.open = shield.pending = False
            raise _held() from e
        raise
    shield.open = True
    if shield.pending:  # came while fn ran (one coming from here on raises by itself)
        shield.open = shield.pending = False
        raise _held()
    return out


def _held(how: str = "held until what tunekit measures was whole, then raised here") -> KeyboardInterrupt:
    """The KeyboardInterrupt of a Ctrl-C tunekit raises itself, saying so (its traceback ends in
    this module, which would otherwise read as tunekit's own failure)."""
    e = KeyboardInterrupt()
    e.add_note(f"tunekit: your Ctrl-C, {how}")
    e._tunekit_held = True   # tunekit's own: `deferred_interrupt.__exit__` tells it from Python's plain one
    return e


SECOND = "tunekit: second Ctrl-C: stopped while {doing} (that was finished first: nothing is lost)"


def second_ctrl_c(exc: BaseException, doing: str | None = None) -> str:
    """Note on ``exc`` (the first Ctrl-C's KeyboardInterrupt, travelling) that a second one came
    while ``doing`` ran and waited for it; once per exception. Returns the note."""
    note = SECOND.format(doing=doing or "tunekit cleaned up after the first")
    if not getattr(exc, "_tunekit_second_ctrl_c", False):
        exc.add_note(note)
        exc._tunekit_second_ctrl_c = True
    return note


def end_shown(shield, error: BaseException | None, shown: BaseException | None, doing: str) -> None:
    """``shield.__exit__`` for a hook that ends a path after its caller showed how the user's code
    ended (``shown``: IPython's post_run_cell after the cell's traceback). If that was a Ctrl-C,
    a second one meanwhile is not raised as a traceback of its own but said on stderr, and noted
    on ``shown`` (the first stopped everything already); else as ``__exit__``."""
    if error is not None or not isinstance(shown, KeyboardInterrupt):
        shield.__exit__(error and type(error), error, None)
        return
    noted, shield.doing = len(getattr(shown, "__notes__", ())), shield.doing or doing
    try:
        shield.__exit__(KeyboardInterrupt, shown, None)   # a Ctrl-C meanwhile: noted on `shown`
        if len(getattr(shown, "__notes__", ())) > noted:
            print(shown.__notes__[-1], file=sys.stderr)
    except KeyboardInterrupt:   # one that came just after the shield ended
        print(second_ctrl_c(shown, shield.doing), file=sys.stderr)


def interrupt_pending() -> bool:
    """True while a Ctrl-C waits in an active shield (the block it came in was interrupted)."""
    s = innermost()
    while s is not None:
        if s.pending:
            return True
        s = s.outer
    return False
