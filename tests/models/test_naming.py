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
