"""Bad input at every public door: a Lab's model, functions and devices are checked at
construction (one tiny dry step, nothing of the model changed), every state file of any shape is
ignored with one warning, and numeric and device arguments outside their meaning are refused."""
import random

import numpy as np
import pytest
import torch

from tunekit.lab import Lab, ToggleError


class MLP(torch.nn.Module):   # vectors in, vectors out; BatchNorm keeps running statistics
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 32)
        self.norm = torch.nn.BatchNorm1d(32)

    def forward(self, x):
        return self.norm(self.lin(x))


def batches(b, s):
    return torch.randn(b, 16), torch.randn(b, 32)


def mse(model, x, y):
    return (model(x) - y).square().mean()


def _lab(tmp_path, model=None, **kw):
    return Lab(MLP() if model is None else model, log_path=tmp_path / "r.jsonl", peak_tflops=1.0, **kw)


# --- item 4: a Lab's inputs, checked at construction ------------------------------------------


@pytest.mark.parametrize("kw,error,message", [
    ({"model": MLP}, TypeError,
     "model is the class MLP, not a model: pass an instance, e.g. MLP(...) instead of MLP"),
    ({"model": 42}, TypeError,
     "model must be None, an nn.Module instance or a factory 'package.module:function', got int 42"),
    ({"batch_fn": 3, "loss_fn": mse}, TypeError,
     "batch_fn must be a function (micro_batch, seq_len) -> (x, y), got int 3"),
    ({"batch_fn": batches, "loss_fn": 4}, TypeError, "loss_fn must be a function (model, x, y) -> loss, got int 4"),
    ({"batch_fn": MLP, "loss_fn": mse}, TypeError, "batch_fn must be a function (micro_batch, seq_len) -> (x, y), "
                                                   "got type <class 'test_bad_inputs.MLP'>"),
    ({"batch_fn": lambda b: batches(b, 1), "loss_fn": mse}, TypeError,
     "batch_fn must take (micro_batch, seq_len); its signature is (b)"),
    ({"batch_fn": lambda b, s: torch.zeros(b, 16), "loss_fn": mse}, TypeError,
     "batch_fn must return a pair (x, y), got Tensor (2, 16) float32 on cpu"),
    ({"batch_fn": lambda b, s: {"x": 1}, "loss_fn": mse}, TypeError,
     "batch_fn must return a pair (x, y), got dict {'x': 1}"),
    ({"batch_fn": lambda b, s: 1 / 0, "loss_fn": mse}, ValueError,
     "batch_fn(2, 1) raised ZeroDivisionError: division by zero -- it must return (x, y) for micro_batch "
     "samples of seq_len tokens"),
    ({"batch_fn": batches, "loss_fn": lambda m, x: m(x).mean()}, TypeError,
     "loss_fn must take (model, x, y); its signature is (m, x)"),
    ({"batch_fn": lambda b, s: (torch.zeros(b, 8), torch.zeros(b, 32)), "loss_fn": mse}, ValueError,
     "loss_fn failed on a batch of batch_fn(2, 1) (x: Tensor (2, 8) float32 on cpu, y: Tensor (2, 32) float32 on "
     "cpu): RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x8 and 16x32) -- make batch_fn return what "
     "the model takes (shape, dtype, device), or give a loss_fn that feeds it"),
    ({"batch_fn": batches, "loss_fn": lambda m, x, y: (m(x) - y).square()}, ValueError,
     "loss_fn returned a tensor of shape (2, 32), not one number: reduce it (e.g. .mean()) so that backward() "
     "has a scalar to start from"),
    ({"batch_fn": batches, "loss_fn": lambda m, x, y: 0.5}, TypeError,
     "loss_fn must return the loss as a tensor with one element, got float 0.5"),
    ({"batch_fn": batches, "loss_fn": lambda m, x, y: m(x).argmax()}, TypeError,
     "loss_fn returned a torch.int64 tensor: backward() needs a floating-point loss"),
    ({"batch_fn": batches, "loss_fn": mse, "micro_batch": 0}, ToggleError,
     "Lab(...) defaults: micro_batch must be a whole number >= 1 (got 0): a step needs at least one sample."),
    ({"batch_fn": batches, "loss_fn": mse, "lr": float("nan")}, ToggleError, "Lab(...) defaults: lr must be"),
    ({"batch_fn": batches, "loss_fn": mse, "seed": -1}, ValueError, "seed must be a whole number >= 0, got -1"),
    ({"batch_fn": batches, "loss_fn": mse, "peak_tflops": 0}, ValueError,
     "peak_tflops must be a finite number > 0, got 0"),
    ({"batch_fn": batches, "loss_fn": mse, "device": "gpu"}, ValueError,
     "device must be one of ('cpu', 'cuda', 'mps'), optionally with an index ('cuda:1'), or a torch.device, got 'gpu'"),
    ({"batch_fn": batches, "loss_fn": mse, "device": "meta"}, ValueError, "device must be one of"),
    ({"batch_fn": batches, "loss_fn": mse, "device": "cpu:1"}, ValueError,
     "device='cpu:1': this machine has 1 CPU device(s), indices 0 to 0"),
])
def test_a_lab_refuses_bad_inputs_before_any_training(tmp_path, kw, error, message):
    kw = {"model": MLP(), **kw}
    model = kw["model"]
    before = [p.detach().clone() for p in model.parameters()] if isinstance(model, torch.nn.Module) else []
    with pytest.raises(error) as info:
        Lab(log_path=tmp_path / "r.jsonl", **kw)
    assert str(info.value).startswith(message), str(info.value)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters() if before else []))
    assert not (tmp_path / "r.jsonl").exists()   # nothing ran, nothing was logged


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:1", torch.device("cuda"), 0])
def test_a_lab_on_a_missing_cuda_device_is_refused_with_what_to_do(tmp_path, device):
    with pytest.raises(ValueError, match=r"^device='cuda(:[01])?': this machine has no CUDA device \(torch sees "
                                         r"none\); use device='cpu', or run where one is$"):
        _lab(tmp_path, batch_fn=batches, loss_fn=mse, device=device)


def test_a_models_own_loss_that_is_not_one_number_is_refused(tmp_path):
    class Logits(torch.nn.Module):   # takes (x, y) but returns logits, not a loss
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(256, 8)

        def forward(self, x, y=None):
            return self.emb(x)

    with pytest.raises(ValueError, match=r"^the model's own loss returned a tensor of shape \(2, 16, 8\), not one "
                                         r"number: give loss_fn=lambda model, x, y: \.\.\. that returns the loss$"):
        _lab(tmp_path, Logits(), seq_len=64)   # built-in token batches: the dry step takes 16 of them


def test_the_dry_step_changes_neither_the_model_nor_any_random_stream(tmp_path):
    model = MLP()
    state = {k: v.clone() for k, v in model.state_dict().items()}   # BatchNorm statistics included

    def noisy(b, s):   # draws from torch's, Python's and numpy's global generators
        return torch.randn(b, 16) + random.random() + float(np.random.rand()), torch.randn(b, 32)

    def draws():
        return torch.rand(3).tolist(), random.random(), float(np.random.rand())

    torch.manual_seed(7), random.seed(7), np.random.seed(7)
    expected = draws()
    torch.manual_seed(7), random.seed(7), np.random.seed(7)
    lab = Lab(model, batch_fn=noisy, loss_fn=mse, log_path=tmp_path / "r.jsonl", seed=7)  # seeds torch with 7
    assert draws() == expected
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert model.norm.num_batches_tracked.item() == 0 and lab.model.training


def test_a_lab_draws_the_same_batches_and_losses_with_its_dry_step(tmp_path):
    # the built-in batcher's generator is put back: the first run trains on the batches it would
    # have drawn anyway, so losses stay reproducible from the seed
    lab = Lab(log_path=tmp_path / "r.jsonl", peak_tflops=1.0, micro_batch=2, seq_len=32)
    fresh = torch.Generator().manual_seed(0)
    assert torch.equal(lab.batcher.generator.get_state(), fresh.get_state())
