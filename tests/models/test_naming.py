"""A model's label through torch.compile's and DDP's wrappers: the class it trains, "(compiled)"."""
import torch

import tunekit
from tunekit.models.gpt import GPT, GPTConfig
from tunekit.models.naming import model_label


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x)


def test_a_wrapped_model_is_named_by_the_module_it_wraps():
    net = Net()
    assert model_label(net) == "Net"
    assert model_label(torch.compile(net)) == "Net (compiled)"             # not "OptimizedModule"
    assert model_label(torch.nn.DataParallel(net)) == "Net (DataParallel)"
    assert model_label(torch.compile(torch.nn.DataParallel(net))) == "Net (compiled, DataParallel)"


def test_a_lab_of_a_compiled_model_says_which_model_it_trains():
    torch.manual_seed(0)
    # the eager backend: the wrapper without inductor's compile time
    lab = tunekit.Lab(torch.compile(GPT(GPTConfig.preset("cpu-tiny")), backend="eager"), device="cpu")
    assert "GPT (compiled) · " in repr(lab).splitlines()[1]


class Conv(torch.nn.Module):
    """A small CNN with no block list: checkpointing it needs blocks= named by hand."""

    def __init__(self):
        super().__init__()
        self.c1, self.bn, self.fc = torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(self.bn(self.c1(x)).mean((2, 3)))


def test_the_blocks_refusal_names_what_this_model_could_checkpoint():
    from tunekit.models.naming import blocks_example

    stack = torch.nn.Module()
    stack.body = torch.nn.Module()
    stack.body.layers = torch.nn.ModuleList([Net(), Net()])
    assert blocks_example(stack) == "Lab(model, blocks='body.layers') (its module lists: body.layers)"
    assert blocks_example(torch.compile(Conv())) == ("Lab(model, blocks=[model.c1, ...]) with the modules to "
                                                     "recompute (its children: c1, bn, fc)")
    assert blocks_example(torch.nn.Sequential(Net(), Net())).startswith("Lab(model, blocks=[model[0], ...])")
    lab = tunekit.Lab(Conv(), lambda mb, T: (torch.randn(mb, 3, 8, 8), torch.randint(0, 2, (mb,))),
                      lambda m, x, y: torch.nn.functional.cross_entropy(m(x), y), device="cpu")
    # it said "e.g. Lab(model, blocks='layers')", an attribute this model does not have
    assert lab.check(lab.resolve(checkpointing=True)) == [
        "tunekit does not know Conv's blocks: name them to checkpoint them, e.g. Lab(model, blocks=[model.c1, ...]) "
        "with the modules to recompute (its children: c1, bn, fc)."]
