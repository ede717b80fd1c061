"""Where a plan of your own nn.Module says its peak is: in your model, never in tunekit's wrapper
of the model and its loss (a CNN's plan with a loss_fn said 'in Stepped (threshold_backward.default)',
without one 'in model (...)': the wrapper's class and its attribute's name)."""
import torch
import torch.nn.functional as F

import tunekit


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
    # without a loss_fn, a backward op of no module of its own keeps the module seen before it
    # (measure.live: the fc's): one of the model's own, never the wrapper's
    place = summed.peak_at.split(", in ")[1].split(" (")[0]
    assert place in {"Conv", "c1", "fc"} and summed.peak_at.endswith("(threshold_backward.default)")
