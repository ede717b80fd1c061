"""A GPU plan in a precision the card has no expected figures for says which precision has them
and how to ask for it (a note of its own kind), and still plans what was asked."""
import tunekit
from tunekit.core.notes import of_kind
from tunekit.models.gpt import GPTConfig


def test_an_fp32_plan_on_an_h100_names_the_precision_with_an_expected_step():
    # H100 SXM's row has a MAMF in bf16 and none in fp32 (core/gpus.py): no expected step in fp32
    p = tunekit.plan(GPTConfig.preset("cpu-tiny"), "H100 SXM", precision="fp32", verbose=False)
    assert p.expected is None and p.setting.precision == "fp32"      # what was asked, planned
    assert len(of_kind(p.notes, "expected.missing")) == 1
    [other] = of_kind(p.notes, "expected.other_precision")
    assert str(other) == ("H100 SXM has an expected step in bf16: plan with precision='bf16' (tunekit.plan(..., "
                          "'H100 SXM', precision='bf16'), lab.plan('H100 SXM', precision='bf16'))")
    asked = tunekit.plan(GPTConfig.preset("cpu-tiny"), "H100 SXM", precision="bf16", verbose=False)
    assert asked.expected is not None and not of_kind(asked.notes, "expected.other_precision")
