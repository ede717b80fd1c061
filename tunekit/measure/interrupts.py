"""Ctrl-C that cannot tear measurement state. Measurement layer.

Installing or removing a FLOP counter (a torch dispatch mode plus module hooks) or a memory meter
takes a few lines; a KeyboardInterrupt between two of them would leave the process measuring
forever (every later op slowed, every later timing wrong). Inside ``deferred_interrupt()`` a
SIGINT is only remembered; it is raised as KeyboardInterrupt when the block has finished, so the
state is either fully set up or fully removed. Outside the main thread (no signals there) it
does nothing.
"""
from __future__ import annotations

import contextlib
import signal
import threading


@contextlib.contextmanager
def deferred_interrupt():
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    try:
        previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    except (ValueError, TypeError, OSError):  # no signal support here
        yield
        return
    try:
        yield
    except BaseException:
        signal.signal(signal.SIGINT, previous)
        raise   # the block's own error wins; a Ctrl-C that came meanwhile is dropped with it
    signal.signal(signal.SIGINT, previous)
    if received:
        raise KeyboardInterrupt
