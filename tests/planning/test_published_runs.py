"""data/published_runs.csv, the published training runs benchmarks/bench_expected.py plans (issue 39):
its schema, that every row names its source, and that the bench reads it. No plan is made; reading
it through the bench (which imports transformers and the planner) is marked slow."""
import csv
import re
from pathlib import Path

import pytest

from tests.helpers import load_script
from tunekit.core.efficiency import ATTENTION_KERNELS
from tunekit.core.registry import PRECISIONS
from tunekit.core.specs import find_spec

ROOT = Path(__file__).resolve().parents[2]
CSV = ROOT / "data" / "published_runs.csv"
COLUMNS = ["label", "software", "source", "table", "model", "arch", "d_model", "n_heads", "n_kv_heads", "n_layers",
           "d_ff", "vocab", "device", "gpus", "nodes", "micro_batch", "grad_accum", "seq_len", "checkpointing",
           "published_precision", "precision", "weights", "attention_kernel", "compile", "fsdp", "bias", "norm",
           "norm_precision", "loss_precision", "model_source", "published_tokens_per_s_per_gpu"]
INTS = ["d_model", "n_heads", "n_kv_heads", "n_layers", "d_ff", "vocab", "gpus", "nodes", "micro_batch",
        "grad_accum", "seq_len", "published_tokens_per_s_per_gpu"]
# MPT shapes (d_model, n_heads, n_layers): mosaicml/llm-foundry scripts/train/yamls/pretrain/mpt-*.yaml
# at commit b2a43a1 (each: vocab_size 50368, expansion_ratio 4)
MPT = {"MPT-125m": (768, 12, 12), "MPT-350m": (1024, 16, 24), "MPT-760m": (1536, 12, 24),
       "MPT-1b": (2048, 16, 24), "MPT-3b": (2560, 20, 32), "MPT-7b": (4096, 32, 32), "MPT-13b": (5120, 40, 40),
       "MPT-30b": (7168, 56, 48), "MPT-70b": (8192, 64, 80)}
# a source is a repository file at a commit ("owner/name path @ 40 hex digits") or a web address
SOURCE = re.compile(r"^([\w.-]+/[\w.-]+ \S+ @ [0-9a-f]{40}|https://\S+( .*)?)$")


def rows():
    with open(CSV, newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == COLUMNS
        return list(reader)


def test_schema_and_values():
    runs = rows()
    assert len(runs) >= 60 + 16          # 60 compared at least, beside the 16 A100 40GB rows (no expectation yet)
    assert len({r["label"] for r in runs}) == len(runs)          # a label names one run
    for r in runs:
        assert all(r[c].strip() for c in COLUMNS), r["label"]     # no empty field
        assert all(int(r[c]) > 0 for c in INTS), r["label"]
        assert r["checkpointing"] in ("none", "full", "selective"), r["label"]
        assert r["precision"] in PRECISIONS and r["weights"] in ("fp32", "bf16", "fp16"), r["label"]
        assert r["attention_kernel"] in ATTENTION_KERNELS and r["compile"] in ("true", "false"), r["label"]
        spec = find_spec(r["device"])
        assert spec is not None and spec.name == r["device"], r["label"]   # the spec table's own name
        gpus, nodes = int(r["gpus"]), int(r["nodes"])
        assert nodes == max(1, gpus // 8) and gpus <= 8 * nodes, r["label"]   # 8 GPUs a node


def test_every_row_names_its_source():
    for r in rows():
        assert SOURCE.match(r["source"]), (r["label"], r["source"])
        assert r["table"].strip() and r["software"].strip(), r["label"]


def test_mpt_shapes_are_llm_foundrys():
    mpt = [r for r in rows() if r["arch"] == "mpt"]
    assert {r["model"] for r in mpt} == set(MPT)                  # every size, 125m to 70b
    for r in mpt:
        d, h, n = MPT[r["model"]]
        assert (int(r["d_model"]), int(r["n_heads"]), int(r["n_kv_heads"]), int(r["n_layers"])) == (d, h, h, n)
        assert (int(r["d_ff"]), int(r["vocab"])) == (4 * d, 50368)
        assert r["source"].startswith("mosaicml/llm-foundry scripts/train/benchmarking/README.md @ b2a43a1")
        assert r["attention_kernel"] == "triton"                  # every MPT yaml's attn_impl
        # both are bf16 autocast on fp32 weights: Composer reads precision "bf16" as amp_bf16, and FSDP's
        # "PURE" sets MixedPrecision(param/reduce/buffer dtype bf16) over the fp32 parameters
        # (mosaicml/composer v0.13.4 trainer.py and mosaic_fsdp.py; bench_expected.py's docstring)
        assert r["weights"] == "fp32" and r["precision"] == "bf16", r["label"]
        # the "bf16 PURE" rows are the ones b2a43a1 kept from its parent, run on torch 1.13.1 with
        # mosaicml/examples v0.0.4 (the parent's sweep.sh); the rest on llm-foundry v0.3.0, torch 2.1
        assert r["software"] == {"amp_bf16 DEFAULT": "llm-foundry 2023",
                                 "bf16 PURE": "examples v0.0.4 2023"}[r["published_precision"]], r["label"]
        # MPT's choices as the stand-in GPT's options: biases (no_bias False), a LayerNorm in bf16 (LPLayerNorm),
        # flash-attn's fused cross-entropy on the bf16 logits; sourced at the row's stack's commit
        assert (r["bias"], r["norm"], r["norm_precision"], r["loss_precision"]) == (
            "true", "layer", "compute", "logits"), r["label"]
        repo, commit = {"llm-foundry 2023": ("mosaicml/llm-foundry ", "b2a43a1477a45f40f4086a1c72f851b0ab42d0ac"),
                        "examples v0.0.4 2023": ("mosaicml/examples ", "52cd4fef69497f225a034fcd10692f8613732d10")
                        }[r["software"]]   # examples' tag v0.0.4
        assert r["model_source"].startswith(repo) and r["model_source"].endswith(" @ " + commit), r["label"]


def test_other_rows_take_their_models_own_choices():
    for r in rows():
        if r["arch"] != "mpt":
            assert {r[c] for c in ("bias", "norm", "norm_precision", "loss_precision", "model_source")} == {"n/a"}


def test_the_older_stack_rows():
    """17 rows came from the older runs: the 16 of the A100 40GB table and MPT-70b on 64 A100 80GB."""
    old = [r for r in rows() if r["published_precision"] == "bf16 PURE"]
    assert len(old) == 17                                         # 16 + 1
    assert {r["device"] for r in old} == {"A100 40GB", "A100 80GB"}
    assert [r["label"] for r in old if r["device"] == "A100 80GB"] == ["MPT-70b A100 64 GPUs 8x2048 ckpt pure"]
    assert all(r["device"] == "A100 80GB" or r["label"].endswith(" pure") for r in old)


def test_regimes_covered():
    runs = rows()
    seqs = {int(r["seq_len"]) for r in runs}
    assert min(seqs) == 512 and max(seqs) == 65536
    assert {"A100 40GB", "A100 80GB", "H100 SXM"} <= {r["device"] for r in runs}
    assert max(int(r["gpus"]) for r in runs) >= 128


@pytest.mark.slow   # imports the bench: transformers and tunekit's planner (15 s on 2 busy cores)
def test_the_bench_reads_it():
    bench = _bench()
    runs = bench.read_runs()
    assert len(runs) == len(rows())
    for r in runs:
        assert isinstance(r["seq_len"], int) and isinstance(r["compile"], bool)
        bench.model(r)                                            # a config each, built without planning


def _bench():
    return load_script("benchmarks/bench_expected.py")


def test_the_bias_table_by_group():
    bench = _bench()
    assert [bench.size_b(m) for m in ("MPT-125m", "Llama 3.1 8B", "GPT-2 124M", "MPT-70b")] == [0.125, 8.0, 0.124, 70.0]
    assert bench.group_keys({"seq_len": 8192, "model": "MPT-30b", "device": "H100 SXM"}) == [
        "seq 4096-8192", "card H100 SXM", "size >= 13B"]
    runs = [{"label": "a", "seq_len": 2048, "model": "MPT-1b", "device": "A100 80GB"},
            {"label": "b", "seq_len": 512, "model": "MPT-3b", "device": "A100 80GB"},
            {"label": "c", "seq_len": 65536, "model": "MPT-7b", "device": "H100 SXM"},
            {"label": "d", "seq_len": 2048, "model": "MPT-13b", "device": "H100 SXM"}]   # no ratio: left out
    lines = bench.bias_table({"a": 1.10, "b": 0.90, "c": 1.30}, runs)
    assert [line.split() for line in lines[1:]] == [
        ["seq", "<=", "2048", "2", "1.00", "10.0%"],      # median(1.10, 0.90) = 1.00; |error| 10% both
        ["seq", ">=", "16384", "1", "1.30", "30.0%"],
        ["card", "A100", "80GB", "2", "1.00", "10.0%"],
        ["card", "H100", "SXM", "1", "1.30", "30.0%"],
        ["size", "1-8B", "3", "1.10", "10.0%"]]           # median(0.90, 1.10, 1.30) = 1.10; of |error| 0.1, 0.1, 0.3


def test_the_attention_rate_a_row_is_planned_at():
    bench = _bench()
    # the Triton kernel on an A100, head dim 4096 / 32 = 128: FlashAttention(-1)'s causal fwd+bwd bar at 16k
    # (flash-attention assets/flash2_a100_fwd_bwd_benchmark.png), 83 TFLOPS, held flat past it: 83 / 312 = 0.266026
    share, tflops = bench.attention_rate({"device": "A100 80GB", "attention_kernel": "triton", "d_model": 4096,
                                          "n_heads": 32, "seq_len": 65536, "precision": "bf16"})
    assert share == pytest.approx(83 / 312) and tflops == pytest.approx(83.0)
    # torchtitan's card: FA2's Hopper share 3.5 * 284.1 * 1.935 / 6.723 / 989 = 0.2894 of its own peak,
    # the middle of SXM and NVL (989 + 835.5) / 2 = 912.25: 264.0 TFLOPS (286.2 on the 700 W SXM)
    share, tflops = bench.attention_rate({"device": "H100 SXM 96GB", "attention_kernel": "flash", "d_model": 4096,
                                          "n_heads": 32, "seq_len": 8192, "precision": "bf16"})
    assert share == pytest.approx(3.5 * 284.1 * 1.935 / 6.723 / 989)
    assert tflops == pytest.approx(share * 912.25) and round(tflops, 1) == 264.0


def test_composers_training_metrics_are_counted_on_the_logits():
    bench = _bench()
    row = {"arch": "mpt", "device": "A100 80GB", "precision": "bf16", "micro_batch": 32, "seq_len": 2048,
           "vocab": 50368}
    # MPT-125m's micro-step, 32 x 2048 = 65,536 tokens x 50,368 = 3.30e9 logits, two metrics each: an fp32 copy
    # (2 bytes read, 4 written), log_softmax in fp32 (4 + 4) and nll_loss (an int64 target and one fp32 picked a
    # row, one sum written: 65,536 x 12 + 4 bytes, 0.45 us: an eager launch's 5 us instead), at the A100 80GB's
    # streaming 2.0 x 1.80 / 2.04 = 1.765 TB/s: 2 x (3.30e9 x 14 / 1.765e12 + 5e-6) = 52.4 ms
    elements, tbs = 65536 * 50368, 2.0 * 1.80 / 2.04
    want = 2 * ((elements * 6 + elements * 8) / (tbs * 1e12) + 5e-6)
    assert bench.metrics_seconds(row) == pytest.approx(want) and round(want * 1e3, 1) == 52.4
    assert bench.metrics_seconds(dict(row, arch="llama")) == 0.0    # torchtitan computes no metric on the logits


@pytest.mark.slow   # two plans of a 2-block GPT (a few seconds on 2 busy cores)
def test_the_examples_era_rows_recompute_whole_blocks():
    bench = _bench()
    row = {"arch": "mpt", "software": "llm-foundry 2023", "d_model": 64, "n_heads": 2, "n_kv_heads": 2, "n_layers": 2,
           "d_ff": 256, "vocab": 128, "device": "A100 80GB", "gpus": 1, "nodes": 1, "micro_batch": 2, "grad_accum": 1,
           "seq_len": 32, "checkpointing": "full", "precision": "bf16", "weights": "fp32", "attention_kernel": "triton",
           "compile": False, "fsdp": "n/a", "bias": True, "norm": "layer", "norm_precision": "compute",
           "loss_precision": "logits"}

    def addmm_calls(software):
        return {r[0]: r[2] for r in bench.plans(dict(row, software=software))[0].expected.rows}["addmm"]

    # 2 blocks x 4 biased linear layers (qkv, attention out, MLP up, MLP down): 8 addmm in the forward. torch 2.1's
    # early stop reruns 3 a block in backward (not the MLP's down projection): 8 + 2 x 3 = 14; torch 1.13.1's
    # checkpoint reran the whole block: 8 + 2 x 4 = 16
    assert addmm_calls("llm-foundry 2023") == 14
    assert addmm_calls("examples v0.0.4 2023") == 16
