"""The ``nn.Module: <class>`` ranges a traced block's profiler records around every module's
forward (measure.trace installs them while it traces). Measurement layer; nothing here prints.
"""
from __future__ import annotations

import torch


class ModuleRanges:
    """A ``nn.Module: <class>`` profiler range around every module's forward while installed.

    The hooks run inside the user's code, so a Ctrl-C there waits until a hook is done
    (`interrupts.held`): a range is entered and on the stack, or neither. Ranges a forward left
    open (it raised past its hook) are closed before the profiler stops (`close`): one closed
    after its profiler session ended crashed the interpreter later, in the garbage collector
    (tests/measure/test_interrupts.py's traced sweep, CPython 3.11, torch 2.13)."""

    def __init__(self):
        self.stack, self.handles = [], []

    def install(self):
        from torch.nn.modules import module as m

        from tunekit.measure.interrupts import held

        def enter(name):
            r = torch.autograd.profiler.record_function(name)
            r.__enter__()
            self.stack.append(r)

        def leave():
            if self.stack:
                self.stack.pop().__exit__(None, None, None)

        def pre(mod, args):
            held(enter, f"nn.Module: {type(mod).__name__}")

        def post(mod, args, out):
            held(leave)

        self.handles = [m.register_module_forward_pre_hook(pre),
                        m.register_module_forward_hook(post, always_call=True)]
        return self

    def close(self):
        while self.stack:  # a forward that raised past its hook: close its range
            self.stack.pop().__exit__(None, None, None)

    def remove(self):
        for h in self.handles:
            h.remove()
        self.close()
