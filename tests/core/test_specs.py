import warnings

import pytest

from tunekit.core import specs
from tunekit.measure import peaks


@pytest.mark.parametrize("name, dtype, expected", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989),
    ("NVIDIA H100 PCIe", "bf16", 756),
    ("NVIDIA H100 NVL", "fp16", 835.5),
    ("NVIDIA H200", "fp8", 1979),
    ("NVIDIA A100-SXM4-80GB", "tf32", 156),
    ("NVIDIA A100-PCIE-40GB", "bf16", 312),
    ("NVIDIA B200", "bf16", 2250),
    ("NVIDIA L4", "bf16", 121),
    ("NVIDIA L40S", "bf16", 362),
    ("NVIDIA A10G", "fp32", 31.2),
    ("Tesla V100-SXM2-16GB", "fp16", 125),
    ("Tesla V100-PCIE-32GB", "fp16", 112),
    ("Tesla T4", "fp16", 65),
    ("NVIDIA GeForce RTX 4090", "bf16", 165.2),   # tensor cores, fp32 accumulate (Ada whitepaper)
    ("NVIDIA GeForce RTX 3090", "fp32", 35.6),
    ("AMD Instinct MI300X", "bf16", 1300),
    ("AMD Instinct MI250X", "bf16", 191.5),  # 383 per package / 2 GCDs
])
def test_spec_peaks(name, dtype, expected):
    value, source = specs.spec_peak(name, dtype)
    assert value == pytest.approx(expected)
    assert "dense" in source


def test_short_names_do_not_match_longer_models():
    assert specs.find_spec("NVIDIA L40S").name == "L40S"   # not L4
    assert specs.find_spec("NVIDIA A100 80GB PCIe").name == "A100 80GB"  # not A10G
    assert specs.find_spec("NVIDIA A100-SXM4-40GB").name == "A100 40GB"
    assert specs.find_spec("NVIDIA GH200 480GB") is None


@pytest.mark.parametrize("typed,row", [
    ("H100X", None), ("h1000", None), ("A100x 80GB", None), ("MI300A", None),   # typos and other cards: refused
    ("NVIDIA A10G", "A10G"), ("NVIDIA A10", "A10G"), ("AMD Instinct MI300X", "MI300X"),
    ("AMD Instinct MI250X", "MI250X (one GCD)"), ("Tesla V100-SXM2-16GB", "V100 SXM"), ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA GeForce RTX 4090", "RTX 4090"), ("Tesla T4", "T4")])
def test_a_name_is_read_as_a_row_only_where_each_word_it_matched_is_the_row_s(typed, row):
    # the word holding a match is the match itself or a word of the row's name: 'h100x' is no H100
    # (the planner used to read it as H100 SXM, with only a note)
    got = specs.find_spec(typed)
    assert (got and got.name) == row


def test_torchtitans_h100_is_its_own_card():
    # Grand Teton's 96 GB HBM2e H100 at 2.4 TB/s (torchtitan's benchmarks); its peak "between SXM and NVL":
    # the middle of the two, (989 + 835.5) / 2 = 912.25 bf16, fp8 twice that
    card = specs.find_spec("H100 96GB")
    assert card.name == "H100 SXM 96GB" and card.bandwidth_tbs == 2.4 and card.link_gbs == 450
    assert card.tflops["bf16"] == 912.25 and card.tflops["fp8"] == 1824.5 and "between SXM and NVL" in card.source
    assert card.borrows.value == "H100 SXM"
    assert specs.find_spec("NVIDIA H100 80GB HBM3").name == "H100 SXM"


def test_missing_dtype_and_unknown_device():
    assert specs.spec_peak("NVIDIA A100-SXM4-80GB", "fp8")[0] is None  # Ampere has no fp8
    assert specs.spec_peak("Mystery Accelerator 9000")[0] is None
    with pytest.raises(ValueError):
        specs.spec_peak("NVIDIA H100", "int4")


def test_every_card_without_a_training_dtypes_peak_says_what_it_runs_instead():
    from tunekit.core.registry import PRECISIONS

    trained = {p.compute for p in PRECISIONS.values()}       # the dtypes a training step's matmuls run in
    assert trained == {"fp32", "tf32", "bf16", "fp16"}
    lacking = {(s.name, d): specs.runs_instead(s, d) for s in specs.SPECS for d in sorted(trained) if d not in s.tflops}
    # the cards before Ampere (no bf16/TF32 tensor cores) and CDNA2 (no TF32): nothing else lacks one
    assert sorted(lacking) == [("MI250X (one GCD)", "tf32"), ("T4", "bf16"), ("T4", "tf32"), ("V100 PCIe", "bf16"),
                               ("V100 PCIe", "tf32"), ("V100 SXM", "bf16"), ("V100 SXM", "tf32")]
    assert all(v is not None for v in lacking.values())     # each says what it runs instead ...
    for (name, _), (instead, _why) in lacking.items():       # ... a dtype the card has a peak for
        assert instead in specs.find_spec(name).tflops
    t4 = specs.find_spec("T4")
    assert specs.runs_instead(t4, "bf16") == ("fp16", "no bf16 tensor cores (they came with Ampere, compute "
                                                      "capability 8.0): its half precision is fp16 with a gradient "
                                                      "scaler (precision='fp16')")
    assert specs.runs_instead(t4, "fp16") is None             # listed: nothing instead


def test_peak_tflops_unknown_gives_none_and_one_notice():
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert peaks.peak_tflops("Mystery Accelerator 9000", "bf16") is None
        assert peaks.peak_tflops("Mystery Accelerator 9000", "bf16") is None
    assert len([x for x in w if "no spec-sheet peak" in str(x.message)]) == 1
    assert peaks.peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
