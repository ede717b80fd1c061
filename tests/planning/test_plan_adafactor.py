"""Adafactor in the fake step (issue 42): torch's Adafactor reads its step count and norms with
``.item()``, which a fake tensor cannot answer; the fake step answers 1 (measure.torch_private.
fake_scalar_reads), so a plan of it is a fake step with an expected time and its real state."""
import pytest

from tunekit.core.efficiency import OPTIMIZER_OPS


@pytest.mark.usefixtures("fixed_cpu")
def test_an_adafactor_plan_is_a_fake_step_with_its_factored_state_and_an_expected_step(lab):
    p = lab.plan("cpu", optimizer="adafactor", micro_batch=2, seq_len=32, verbose=False)
    assert p.method == "fake step" and p.expected is not None
    params = [q for q in lab.model.parameters() if q.requires_grad]
    # torch's Adafactor keeps per parameter a step (0-dim fp32, 4 B), and for a matrix (r x c) a row
    # variance (r x 1) and a column variance (1 x c), for a vector a variance of its size (fp32 each)
    state = sum(4 + 4 * ((q.shape[0] + q.shape[1]) if q.dim() == 2 else q.numel()) for q in params)
    assert p.components["optimizer_states"] == state
    (opt,) = [r for r in p.expected.rows if r[1] == "optimizer"]
    assert opt[2] == OPTIMIZER_OPS["adafactor"] * len(params)   # 20 ops per parameter tensor on a CPU


@pytest.mark.usefixtures("fixed_cpu")
def test_lab_expect_answers_for_adafactor(lab):
    e = lab.expect(optimizer="adafactor", micro_batch=2, seq_len=32)
    assert e.step_s > 0 and e.setting.optimizer == "adafactor" and e.calibration == "none"
