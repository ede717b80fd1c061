"""Where a plan of your own nn.Module says its peak is: in your model, never in tunekit's wrapper
of the model and its loss (a CNN's plan with a loss_fn said 'in Stepped (threshold_backward.default)',
without one 'in model (...)': the wrapper's class and its attribute's name)."""
import torch
import torch.nn.functional as F

import tunekit
from tunekit.measure.live import LiveBytes


class Conv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.fc = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Linear(8, 10)

    def forward(self, x, y=None):   # without a loss_fn the plan calls model(x, y) and sums the output
        return self.fc(F.relu(self.c1(x)).mean((2, 3)))


def batches(micro_batch, seq_len):
    return torch.randn(micro_batch, 3, 16, 16), torch.randint(0, 10, (micro_batch,))


def test_a_module_s_peak_is_placed_in_the_module_with_or_without_a_loss_fn():
    given = tunekit.plan(Conv(), "H100", batch_fn=batches, loss_fn=lambda m, x, y: F.cross_entropy(m(x), y),
                         micro_batch=32, verbose=False)
    summed = tunekit.plan(Conv(), "H100", batch_fn=batches, micro_batch=32, verbose=False)
    # the relu (in Conv.forward itself) holds the conv's output gradient beside its own: the peak
    assert given.peak_at == "backward, in Conv (threshold_backward.default)"
    # without a loss_fn too: the relu's node was made by Conv.forward itself (measure.live tags it
    # there), not the fc's whose backward ran before it (it read "in fc")
    assert summed.peak_at == "backward, in Conv (threshold_backward.default)"


class Where(LiveBytes):
    """LiveBytes that keeps (op, where) of every backward op."""

    def __init__(self, model):
        super().__init__(model)
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.phase == "backward":
            self.seen.append((func.__name__.split(".")[0], self.where()))
        return super().__torch_dispatch__(func, types, args, kwargs)


def test_each_backward_op_is_in_the_module_whose_forward_made_it_or_in_none():
    model = Conv()
    x, y = batches(4, 0)
    with Where(model) as live:
        live.set_phase("forward")
        loss = F.cross_entropy(model(x), y)   # outside every module
        live.set_phase("backward")
        loss.backward()
    where = dict(live.seen)   # the last op of each name: each name here runs in one place
    # the loss's backward: no module's forward made it: "" (said "outside every module"), never a stale name
    assert where["nll_loss_backward"] == "" and where["_log_softmax_backward_data"] == ""
    assert where["mm"] == "fc"                              # the Linear's addmm backward: its weight's and input's mm
    # mean((2, 3)) and relu are Conv.forward's own ops (before this fix: "fc", the module run before them)
    assert where["threshold_backward"] == "Conv"
    assert where["convolution_backward"] == "c1"
    assert {w for _op, w in live.seen} == {"", "fc", "Conv", "c1"}
