"""A GPU is one row (docs/ARCHITECTURE.md, "a GPU"): a card added as one `GPU` row of
`core.gpus.GPUS`, and nothing else, is planned (memory, fit, bound), has an expected step and a
peak, is in the dashboard's picker and is taken by `tunekit plan --device`; a figure without its
source is refused when the row is made, so at import."""
import dataclasses
import html
import importlib.util
import math
from pathlib import Path

import pytest

import tunekit
from tunekit.cli.main import main
from tunekit.cli.plan import plan_parser
from tunekit.core import gpus, specs
from tunekit.core.efficiency import gpu_figures
from tunekit.core.gpu import GPU, Sourced, check_table

SHEET = "Test GPU 48GB data sheet (a made-up card)"
CARD = GPU("Test GPU 48GB", ("test gpu",), Sourced({"fp32": 50, "tf32": 100, "bf16": 200, "fp16": 200}, SHEET),
           memory=Sourced(48, SHEET), memory_kind="gddr-ecc", bandwidth=Sourced(1.0, SHEET),
           bandwidth_share=Sourced(0.8, "copies at 0.8 of 1.0 TB/s (example.org/test-gpu-copies)"),
           mamf={"bf16": Sourced(160, "example.org/test-gpu-mamf")}, sms=Sourced(100, SHEET),
           link=Sourced(32, "PCIe Gen4 x16 (test GPU data sheet)"), capability=Sourced((8, 9), SHEET))
CFG = dict(micro_batch=2, seq_len=64)


@pytest.fixture
def card(monkeypatch):
    """The table with one more row, and a short name for it; as it was afterwards."""
    monkeypatch.setattr(gpus, "GPUS", gpus.GPUS + (CARD,))
    monkeypatch.setitem(gpus.ALIASES, "testgpu", CARD.name)
    check_table(gpus.GPUS, gpus.ALIASES, gpus.DEFAULT_DEVICE)
    return CARD


def test_a_row_is_read_by_its_name_its_alias_and_its_drivers_name(card):
    assert specs.find_spec("Test GPU 48GB") is card and specs.find_spec("testgpu") is card
    assert specs.find_spec("NVIDIA Test-GPU 48GB PCIe") is card
    assert specs.spec_peak("Test GPU 48GB", "bf16") == (200.0, f"spec sheet: Test GPU 48GB dense bf16 ({SHEET})")
    assert tunekit.peak_tflops("Test GPU 48GB", "fp16") == 200


def test_the_row_is_planned_with_an_expected_step(card):
    p = tunekit.plan(tunekit.GPTConfig.preset("cpu-tiny"), "Test GPU 48GB", precision="bf16", **CFG, verbose=False)
    # 48 GiB of GDDR with ECC on: 15/16 of 48 x 2^30 = 48,318,382,080 bytes
    assert (p.device, p.device_memory_bytes, p.peak_tflops, p.bandwidth_tbs) == ("Test GPU 48GB", 48318382080, 200,
                                                                                 1.0)
    # compute capability 8.9: torch's pre-Hopper cuBLAS workspace, 4096 KiB x 2 + 16 KiB x 8 = 8,519,680 bytes
    assert p.fixed["cublas_workspace"][0] == 8519680 and p.fixed["cuda_context"][0] == 0.47 * 2**30
    assert p.fits and p.bound_step_s > 0 and 0 < p.bound_mfu <= 1
    assert p.expected is not None and p.expected.step_s >= p.bound_step_s
    fig = gpu_figures("Test GPU 48GB", "bf16", 200, 1.0, compiled=False)
    # its own MAMF and streaming share: 160 TFLOPS, 0.8 x 1.0 TB/s
    assert (fig.mamf_tflops, fig.bandwidth_tbs, fig.sms) == (160, 0.8, 100) and fig.borrowed == ()


def test_a_copy_of_a_row_under_another_name_plans_to_the_same_figures(monkeypatch):
    # nothing reads a card by its name outside its row: the H100 SXM's row renamed plans alike
    h100 = specs.gpu("H100 SXM")
    twin = dataclasses.replace(h100, name="Twin GPU 80GB", match=("twin gpu",))
    monkeypatch.setattr(gpus, "GPUS", gpus.GPUS + (twin,))
    cfg = tunekit.GPTConfig.preset("cpu-tiny")
    a, b = (tunekit.plan(cfg, name, precision="bf16", **CFG, verbose=False) for name in ("H100 SXM", twin.name))
    assert (b.device_memory_bytes, b.fixed, b.components, b.peak_bytes) == (a.device_memory_bytes, a.fixed,
                                                                             a.components, a.peak_bytes)
    assert (b.bound_step_s, b.compute_bound_s, b.expected.step_s) == (a.bound_step_s, a.compute_bound_s,
                                                                      a.expected.step_s)


def test_a_cards_node_network_is_a_field_of_its_row(monkeypatch):
    # the NICs a multi-node collective leaves by come from the row (no table keyed by card name):
    # the H100 SXM's row renamed plans the same collectives over 2 nodes of 8
    from tunekit.planning.shard import ONE_NIC, node_net

    h100 = specs.gpu("H100 SXM")
    twin = dataclasses.replace(h100, name="Twin GPU 80GB", match=("twin gpu",))
    slow = dataclasses.replace(CARD, node_net=Sourced((2, 24.0), "two HDR NICs a node (test card)"))
    monkeypatch.setattr(gpus, "GPUS", gpus.GPUS + (twin, slow))
    assert node_net(twin.name) == (8, 47.0, h100.node_net.source) and dict(twin.figures())["node_net"].value[0] == 8
    assert node_net(slow.name) == (2, 24.0, "two HDR NICs a node (test card)")
    assert node_net("L4") == ONE_NIC and specs.gpu("L4").node_net is None   # a row without one: one NIC assumed
    cfg = tunekit.GPTConfig.preset("cpu-tiny")
    a, b = (tunekit.plan(cfg, name, precision="bf16", parallel="fsdp", world_size=16, nodes=2, **CFG, verbose=False)
            for name in ("H100 SXM", twin.name))
    assert set(a.comm) == {"all_gather/inter", "reduce_scatter/inter"} and b.comm == a.comm
    with pytest.raises(ValueError, match=r"GPU 'Test GPU 48GB': node_net=8: \(NICs per node, GB/s NCCL reaches"):
        dataclasses.replace(CARD, node_net=Sourced(8, "a data sheet"))
    with pytest.raises(ValueError, match=r"GPU 'Test GPU 48GB': node_net GB/s per NIC=0: a positive number"):
        dataclasses.replace(CARD, node_net=Sourced((8, 0), "a data sheet"))


def test_the_row_is_in_the_dashboards_picker(card, make_lab):
    dash = make_lab(peak_tflops=1.0, **CFG).dashboard()
    assert ("Test GPU 48GB", "Test GPU 48GB") in dash.plan_picker.options
    dash.plan_picker.value = "Test GPU 48GB"
    assert dash.last_plan.device == "Test GPU 48GB" and "✓ fits" in html.unescape(dash.plan_html.value)


def test_tunekit_plan_takes_the_row(card, capsys):
    assert "Test GPU 48GB" in plan_parser().format_help()
    for name in ("Test GPU 48GB", "testgpu"):
        assert main(["plan", "--model", "cpu-tiny", "--device", name, "--precision", "bf16", "--micro-batch", "2",
                     "--seq-len", "64"]) == 0
        assert "Test GPU 48GB" in capsys.readouterr().out


def test_a_row_without_a_bf16_peak_sets_the_default_precision_by_its_rule(monkeypatch):
    # a pre-Ampere card: what it trains instead of bf16 is a field of its row (runs_instead), and the
    # one default rule (core.setting.best_precision) reads it for the plan and for `tunekit plan`
    from tunekit.cli.main import parser
    from tunekit.cli.plan import setting_of
    from tunekit.core.setting import best_precision

    old = dataclasses.replace(CARD, name="Old GPU 16GB", match=("old gpu",), memory=Sourced(16, SHEET),
                              peaks=Sourced({"fp32": 10, "fp16": 80}, SHEET), mamf={},
                              capability=Sourced((7, 0), SHEET),
                              runs_instead={"bf16": ("fp16", "no bf16 tensor cores (the test card)")})
    monkeypatch.setattr(gpus, "GPUS", gpus.GPUS + (old,))
    assert (best_precision("Old GPU 16GB"), best_precision("Test GPU 48GB")) == ("fp16", "fp32")   # not a row yet
    p = tunekit.plan(tunekit.GPTConfig.preset("cpu-tiny"), "Old GPU 16GB", **CFG, verbose=False)
    assert p.setting.precision == "fp16" and p.peak_tflops == 80
    assert setting_of(parser().parse_args(["plan", "--device", "Old GPU 16GB"])).precision == "fp16"
    bf16 = tunekit.plan(tunekit.GPTConfig.preset("cpu-tiny"), "Old GPU 16GB", precision="bf16", **CFG, verbose=False)
    assert bf16.peak_tflops is None   # asked for anyway: no bound, and the row's words say why
    assert any("no bf16 tensor cores (the test card)" in str(n) for n in bf16.notes)


def test_the_table_is_unchanged_afterwards():
    assert "Test GPU 48GB" not in specs.names() and "testgpu" not in gpus.ALIASES
    assert specs.find_spec("Test GPU 48GB") is None


def test_the_alias_table_says_what_the_drivers_name_matching_reads():
    # an alias names the row that matching its words would find anyway: it changes no reading
    for alias, name in gpus.ALIASES.items():
        assert next(g for g in gpus.GPUS if specs.matches(alias, g)).name == name
    # and every row's own name finds that row by its match words (a variant sits before its base card)
    for g in gpus.GPUS:
        assert next(r for r in gpus.GPUS if specs.matches(g.name.lower(), r)) is g
    assert gpus.DEFAULT_DEVICE == "H100 SXM" and specs.find_spec(gpus.DEFAULT_DEVICE).name == "H100 SXM"


def test_a_figure_without_its_source_is_refused():
    with pytest.raises(ValueError, match=r"GPU 'Test GPU 48GB': memory=48 has no source: write Sourced\(48, "):
        dataclasses.replace(CARD, memory=48)
    with pytest.raises(ValueError, match=r"GPU 'Test GPU 48GB': mamf\['bf16'\]=160 has no source"):
        dataclasses.replace(CARD, mamf={"bf16": 160})
    with pytest.raises(ValueError, match=r"GPU 'Test GPU 48GB': gemm\['bf16'\]=120 has no source"):
        dataclasses.replace(CARD, gemm={"bf16": 120})
    with pytest.raises(ValueError, match=r"GPU 'Test GPU 48GB': bf16 TFLOPS=0: a positive number"):
        dataclasses.replace(CARD, gemm={"bf16": Sourced(0, "example.org/test-gpu-gemm")})
    with pytest.raises(ValueError, match=r"GPU 'Test GPU 48GB': link=32 has an empty source"):
        dataclasses.replace(CARD, link=Sourced(32, " "))
    with pytest.raises(ValueError, match=r"GPU 'Test GPU 48GB': peaks=None has no source"):
        dataclasses.replace(CARD, peaks=None)
    with pytest.raises(ValueError, match=r"GPU 'Test GPU 48GB': a CUDA card needs its compute capability"):
        dataclasses.replace(CARD, capability=None)
    with pytest.raises(ValueError, match=r"GPU rows named twice: \['Test GPU 48GB'\]"):
        check_table((CARD, CARD), {}, "Test GPU 48GB")
    with pytest.raises(ValueError, match=r"alias 'tg' -> 'Nope': a lower-case name for a row of the table"):
        check_table((CARD,), {"tg": "Nope"}, "Test GPU 48GB")


def test_a_table_with_an_unsourced_figure_is_refused_at_import(tmp_path):
    rows = tmp_path / "my_gpus.py"
    rows.write_text("from tunekit.core.gpu import GPU, Sourced\n"
                    "GPUS = (GPU('My GPU', ('my gpu',), Sourced({'bf16': 100.0}, 'My GPU data sheet'), sms=64,\n"
                    "            capability=Sourced((9, 0), 'My GPU data sheet')),)\n")
    spec = importlib.util.spec_from_file_location("my_gpus", rows)
    with pytest.raises(ValueError, match=r"GPU 'My GPU': sms=64 has no source"):
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


def test_every_row_figure_has_a_source_and_a_sane_value():
    for g in gpus.GPUS:
        figures = dict(g.figures())
        assert "peaks" in figures and all(f.source.strip() for f in figures.values())
        assert g.platform == "rocm" or g.capability.value >= (7, 0)
        if g.memory is not None:
            assert not math.isnan(g.usable[0]) and g.usable[0] <= g.memory.value * 2**30


def test_the_architecture_recipe_says_what_this_file_does():
    doc = (Path(tunekit.__file__).parent.parent / "docs" / "ARCHITECTURE.md").read_text()
    recipe = next(line for line in doc.splitlines() if line.startswith("| a GPU |"))
    for words in ("one `GPU(...)` row in `GPUS` (`core/gpus.py`)", "`Sourced(value, source)`", "`ALIASES`",
                  "refused at import", "`tunekit plan --device`", "tests/core/test_gpu_row.py", "`runs_instead`",
                  "`best_precision`"):
        assert words in recipe
