"""Every spelling of a device a person may type today, and the card (or device type) it is read
as: one home reads them (`core.specs`), the plan, the default precision and the estimate ask it.
Written before that move and kept green through it; a misspelling keeps its "did you mean"."""
import pytest

from tunekit.core import specs
from tunekit.core.memory.options import device_kind
from tunekit.core.setting import best_precision
from tunekit.planning.device import device_figures

# (typed, the row it is read as): the row's own name in any case, with '-' for spaces or padded;
# each alias of core.gpus.ALIASES; a driver's name (nvidia-smi's, torch.cuda.get_device_name's)
CARDS = [
    ("H100 SXM", "H100 SXM"), ("h100 sxm", "H100 SXM"), ("H100-SXM", "H100 SXM"), ("  H100 SXM ", "H100 SXM"),
    ("h100", "H100 SXM"), ("H100", "H100 SXM"), ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("h200", "H200 SXM"), ("b200", "B200"), ("a100", "A100 80GB"), ("A100 80GB", "A100 80GB"),
    ("A100-SXM4-80GB", "A100 80GB"), ("A100 40GB", "A100 40GB"), ("a10", "A10G"), ("NVIDIA A10G", "A10G"),
    ("v100", "V100 SXM"), ("4090", "RTX 4090"), ("NVIDIA GeForce RTX 4090", "RTX 4090"), ("3090", "RTX 3090"),
    ("mi250x", "MI250X (one GCD)"), ("mi300", "MI300X"), ("AMD Instinct MI300X", "MI300X"),
    ("T4", "T4"), ("Tesla T4", "T4"), ("L4", "L4"), ("NVIDIA L4", "L4"), ("l40s", "L40S"),
    # a row's whole name typed without its spaces, or with '_': 'RTX3090' was refused with
    # "did you mean 'RTX 3090'?" while '3090' and 'H100-SXM' were read
    ("RTX3090", "RTX 3090"), ("rtx_4090", "RTX 4090"), ("A100_40GB", "A100 40GB"), ("h100sxm", "H100 SXM"),
    ("H100SXM96GB", "H100 SXM 96GB"), ("MI300-X", "MI300X"),
]


@pytest.mark.parametrize("typed, row", CARDS)
def test_each_spelling_of_a_card_is_read_as_its_row(typed, row):
    assert specs.find_spec(typed).name == row
    if specs.gpu(row).memory_gb is None:   # V100 SXM: no size in the table, refused naming its row
        with pytest.raises(ValueError, match=f"no memory size for {row}: plan for another device"):
            device_figures(typed, "bf16")
    else:
        assert device_figures(typed, "bf16")["name"] == row
    assert device_kind(typed) == "cuda"
    assert best_precision(typed) == best_precision(row)


def test_every_row_and_alias_is_listed_above():
    assert {row for _, row in CARDS} >= set(specs.names()) - {"H100 NVL", "H100 PCIe", "H100 SXM 96GB", "V100 PCIe"}
    assert set(specs.gpus.ALIASES) <= {typed for typed, _ in CARDS}


@pytest.mark.parametrize("typed, kind, precision", [
    ("cpu", "cpu", "fp32"), ("CPU", "CPU", "fp32"), ("cuda", "cuda", "bf16"), ("cuda:1", "cuda:1", "bf16"),
    ("mps", "mps", "fp32"), (None, None, "fp32")])
def test_a_device_type_is_no_card(typed, kind, precision):
    # a torch device type (with an index or not) is read as that, never as a row of the table
    assert device_kind(typed) == kind   # "CPU": no card, kept as typed (the estimate reads no GPU row for it)
    assert best_precision(typed) == precision
    assert typed is None or specs.find_spec(typed) is None


@pytest.mark.parametrize("typed, close", [
    ("H100X", "H100 SXM"), ("H900", "H200 SXM"), ("A1000", "A100 80GB"), ("RTX 4900", "RTX 4090"), ("T5", "T4"),
    ("mi3000", "MI300X"), ("cpux", "cpu"), ("h10", "H100 SXM")])
def test_a_misspelling_is_refused_with_the_name_it_looks_like(typed, close):
    with pytest.raises(ValueError,
                       match=rf"^unknown device '{typed}': did you mean '{close}'\? \(the devices: H100 NVL, "):
        device_figures(typed, "bf16")
    assert specs.find_spec(typed) is None and best_precision(typed) == "fp32"


def test_a_name_nothing_is_close_to_is_refused_with_the_list():
    with pytest.raises(ValueError, match=r"^unknown device 'zzz' \(the devices: H100 NVL, .*, MI300X, or 'cpu'\)$"):
        device_figures("zzz", "bf16")


@pytest.mark.parametrize("typed", ["cuda", "cuda:0", "gpu", "GPU", "mps"])
def test_a_kind_of_device_is_asked_for_a_card_not_read_as_cpu(typed):
    # "cuda" once read "did you mean 'cpu'?": a plan needs a card's memory and peak
    with pytest.raises(ValueError, match=rf"^'{typed}' is a kind of device, not a card: name the card to plan for, "
                                         r"e\.g\. 'H100 SXM', 'A100 80GB', 'L4' or 'RTX 4090' \(this machine's: "
                                         r"torch\.cuda\.get_device_name\(\)\), one of H100 NVL, .*, or 'cpu'$"):
        device_figures(typed, "bf16")


@pytest.mark.parametrize("typed, close", [
    ("RTX 3090 Ti", "RTX 3090"), ("NVIDIA GeForce RTX 3090 Ti", "RTX 3090"), ("RTX 4090 Laptop GPU", "RTX 4090"),
    ("NVIDIA GeForce RTX 4090 D", "RTX 4090"), ("RTX 4090 SUPER", "RTX 4090")])
def test_another_product_of_a_cards_name_is_refused_not_planned_as_the_card(typed, close):
    # a 3090 Ti, a laptop 4090 or a 4090 D has other clocks, memory or power than the row it contains: it was
    # planned as the RTX 3090 with a note at the end; now refused, naming the row it looks like
    with pytest.raises(ValueError, match=rf"^unknown device '{typed}': did you mean '{close}'\?"):
        device_figures(typed, "bf16")
    assert specs.find_spec(typed) is None
