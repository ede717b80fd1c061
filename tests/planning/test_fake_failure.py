"""`fake_failure` tells a fake tensor's limit from the step's own bug by the exception's type,
never by its words (tunekit/planning/analytic.py)."""
import pytest
import torch
from torch._library.fake_profile import MissingOpProfile
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
    UnsupportedFakeTensorException,
    UnsupportedOperatorException,
)
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from tunekit.planning.analytic import fake_failure

aten = torch.ops.aten


def raised_under_fake(step) -> BaseException:
    with FakeTensorMode():
        with pytest.raises(Exception) as info:
            step()
    return info.value


@pytest.mark.parametrize("error", [
    UnsupportedOperatorException(aten.mm.default), UnsupportedFakeTensorException("a tensor subclass"),
    MissingOpProfile("a custom op"), GuardOnDataDependentSymNode(None)])
def test_each_limit_of_a_fake_tensor_is_one_by_its_type(error):
    assert fake_failure(error).startswith(type(error).__name__ + ":")


def test_a_value_read_and_a_value_dependent_shape_say_which():
    assert fake_failure(DataDependentOutputException(aten._local_scalar_dense.default)).startswith(
        "the step reads a tensor's value (aten._local_scalar_dense.default")
    assert fake_failure(DynamicOutputShapeException(aten.nonzero.default)).startswith(
        "an op's output shape depends on tensor values (aten.nonzero.default")
    # what a real fake step raises for them
    assert fake_failure(raised_under_fake(lambda: torch.randn(4).sum().item())).startswith("the step reads")
    assert fake_failure(raised_under_fake(lambda: torch.randn(4).nonzero())).startswith("an op's output shape")


def test_a_limit_raised_from_inside_another_exception_is_found():
    try:
        try:
            raise DataDependentOutputException(aten._local_scalar_dense.default)
        except RuntimeError as inner:
            raise ValueError("a library's own wrapper") from inner
    except ValueError as outer:
        assert fake_failure(outer).startswith("the step reads a tensor's value")


@pytest.mark.parametrize("kind", [RuntimeError, NotImplementedError, ValueError])
def test_words_alone_make_no_limit(kind):
    # the words the old rule read: an exception of torch's plain types is the step's own, whatever it says
    assert fake_failure(kind("fake meta tensor subclass data-dependent, doesn't have storage")) is None


def test_a_meta_kernel_stricter_about_dtypes_is_a_limit_and_a_shape_bug_is_not():
    def offs():   # made under the fake mode, as the step's own tensors are
        return torch.tensor([2, 4], dtype=torch.int32)

    # torch 2.13's meta kernel of _grouped_mm takes bf16 only, its CPU kernel fp32 too
    fp32 = raised_under_fake(lambda: torch._grouped_mm(torch.randn(4, 8), torch.randn(2, 8, 16), offs=offs()))
    assert type(fp32) is RuntimeError and fake_failure(fp32).startswith("RuntimeError:")
    # the contraction dimensions disagree (8 and 9): refused in every dtype, the step's own bug
    bf16 = torch.bfloat16
    bug = raised_under_fake(lambda: torch._grouped_mm(torch.randn(4, 8, dtype=bf16), torch.randn(2, 9, 16, dtype=bf16),
                                                       offs=offs()))
    assert type(bug) is RuntimeError and fake_failure(bug) is None
    # a matmul's shape bug, raised by its meta kernel
    assert fake_failure(raised_under_fake(lambda: torch.randn(2, 16) @ torch.randn(8, 4))) is None
