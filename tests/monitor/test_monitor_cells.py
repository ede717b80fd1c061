"""The Monitor's IPython cell hook (monitor.view.watch_cells): gone as soon as the Monitor is closed,
also after a Ctrl-C cut the hook short. The Ctrl-C is a KeyboardInterrupt raised at a chosen line
event of the hook (a trace function): controlled, no timing involved."""
import sys

import pytest
import torch

pytest.importorskip("IPython")

from IPython.utils.capture import capture_output  # noqa: E402

import tunekit  # noqa: E402


@pytest.fixture
def ip(shell):
    """conftest's shell, left as found (a shell that outlives this module would put every later test in IPython)."""
    yield shell
    shell.user_ns.pop("mon", None)


def _hooks(ip) -> list:
    return list(ip.events.callbacks["post_run_cell"])


def _left_in_a_step(ip):
    """A Monitor made in a cell whose loop was left with the iterator held: a step from ``iter`` going."""
    ip.user_ns.update(torch=torch, tunekit=tunekit)
    ip.run_cell("model = torch.nn.Linear(4, 2)\nmon = tunekit.Monitor(model, live=False)\n"
                "it = mon.iter([torch.ones(2, 4)] * 3)\nmodel(next(it)).sum().backward()")
    return ip.user_ns.pop("mon"), ip.user_ns.pop("it")


def test_close_unregisters_the_cell_hook_at_once(ip):
    before = _hooks(ip)
    mon = tunekit.Monitor(torch.nn.Linear(4, 2), live=False)
    assert len(_hooks(ip)) == len(before) + 1
    mon.close()
    assert _hooks(ip) == before   # no cell ran since: close() took it away itself


class _CtrlC:
    """Raise KeyboardInterrupt at line event ``k`` (from 0) of ``code``'s frames, once; ``n`` counts them."""

    def __init__(self, code, k):
        self.code, self.k, self.n, self.fired = code, k, 0, False

    def __call__(self, frame, event, arg):
        return self.local if frame.f_code is self.code else None

    def local(self, frame, event, arg):
        if event == "line":
            self.n += 1
            if self.n - 1 == self.k:
                self.fired = True
                raise KeyboardInterrupt
        return self.local


def test_a_ctrl_c_at_any_line_of_the_hook_leaves_no_hook_once_closed(ip):
    before = _hooks(ip)
    k, fired = 0, True
    while fired:   # one KeyboardInterrupt at each line event of the hook, until one runs it through
        mon, it = _left_in_a_step(ip)
        (hook,) = [h for h in _hooks(ip) if h not in before]
        ctrl_c, old = _CtrlC(hook.__code__, k), sys.gettrace()
        sys.settrace(ctrl_c)
        try:
            with capture_output():   # IPython catches a hook's KeyboardInterrupt and shows it
                ip.run_cell("pass")
        finally:
            sys.settrace(old)
        fired, k = ctrl_c.fired, k + 1
        mon.close()
        assert _hooks(ip) == before, f"KeyboardInterrupt at line event {k - 1} of the hook"
        del it
    assert k >= 4   # the sweep reached the hook's lines: the step read, the cell's error, end_step, unwatch
