"""tunekit.plan: a training step stepped under fake tensors, measured by the code that measures a
real step. On the CPU its components equal a real step's to the byte; on a GPU of the spec table
it is placed against the card's memory and roofline. No timing is compared."""
import json
import math
import subprocess
import sys
import textwrap

import pytest
import torch

import tunekit
from tunekit.core.notes import kind_of
from tunekit.planning.record import COMPONENTS


def real_components(model, batch, **kw):
    return tunekit.measure_memory(model, batch, estimate=False, **kw).measured


@pytest.mark.parametrize("precision, checkpointing", [("fp32", False), ("bf16", False), ("fp32", True)])
def test_gpt_plan_on_cpu_equals_a_real_step_to_the_byte(precision, checkpointing):
    cfg = tunekit.GPTConfig.preset("cpu-tiny")
    p = tunekit.plan(cfg, "cpu", precision=precision, micro_batch=4, seq_len=64, checkpointing=checkpointing)
    torch.manual_seed(0)
    model = tunekit.GPT(cfg)
    x, y = torch.randint(0, 256, (2, 4, 64))     # inputs and targets, as the plan's batch has them
    real = real_components(model, (x, y), precision=precision, checkpointing=checkpointing, optimizer="adamw")
    assert {k: p.components[k] for k in COMPONENTS} == {k: float(real[k]) for k in COMPONENTS}
    assert p.tokens == 4 * 64 and p.fits and p.device == "cpu"


def test_transformers_plan_on_cpu_equals_a_real_step_to_the_byte():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    p = tunekit.plan(cfg, "cpu", micro_batch=2, seq_len=32)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    x = torch.randint(0, 256, (2, 32))
    real = real_components(model, (x, x), optimizer="adamw", precision="fp32", checkpointing=False)
    assert {k: p.components[k] for k in COMPONENTS} == {k: float(real[k]) for k in COMPONENTS}


def test_the_bound_without_bandwidth_is_the_flops_at_the_peak():
    p = tunekit.plan(tunekit.GPTConfig.preset("cpu-tiny"), "cpu", micro_batch=4, seq_len=64)
    # no bandwidth known for a CPU: every op's time is its FLOPs at the peak, so the sum is
    # executed FLOPs / peak, and the MFU bound is model / executed FLOPs
    assert p.bound_step_s == pytest.approx(p.executed_flops / (p.peak_tflops * 1e12), rel=1e-9)
    assert p.bound_mfu == pytest.approx(p.model_flops / p.executed_flops, rel=1e-9)
    assert p.bound_tokens_per_s == pytest.approx(256 / p.bound_step_s)


def test_a_gpu_plan_adds_the_cuda_context_and_uses_the_spec_sheet():
    p = tunekit.plan(tunekit.GPTConfig.preset("cpu-tiny"), "H100 SXM", precision="bf16", micro_batch=8, seq_len=128)
    assert p.device == "H100 SXM" and p.peak_tflops == 989 and p.bandwidth_tbs == 3.35
    assert p.device_memory_bytes == 81559 * 2**20      # the driver's total for an H100 80GB HBM3
    assert p.fixed["cuda_context"][0] == 0.47 * 2**30
    # the peak of a steady step, every block rounded to 512 B, plus the context and the 32 MiB
    # cuBLAS workspace of a Hopper card
    assert p.fixed["cublas_workspace"][0] == 32 * 2**20
    assert p.total_bytes == p.peak_bytes + 0.47 * 2**30 + 32 * 2**20
    assert "fits" in repr(p) and "upper bounds" in repr(p)


def test_what_does_not_fit_says_so_and_the_search_finds_the_largest_that_does():
    cfg = tunekit.GPTConfig.preset("cpu-small")
    one = tunekit.plan(cfg, "T4", micro_batch=1, seq_len=cfg.block_size)
    assert one.fits
    p = tunekit.plan(cfg, "T4", micro_batch=1, seq_len=cfg.block_size, search=True, search_limit=64)
    assert p.max_micro_batch is not None and 1 <= p.max_micro_batch <= 64
    if p.max_micro_batch < 64:
        over = tunekit.plan(cfg, "T4", micro_batch=p.max_micro_batch + 1, seq_len=cfg.block_size)
        assert not over.fits and "does NOT fit" in repr(over)


def test_a_dtype_the_card_has_no_peak_for_gets_no_bound_and_says_what_the_card_runs_instead(capsys):
    from tunekit.cli.main import main
    from tunekit.core.notes import of_kind

    cfg = tunekit.GPTConfig.preset("cpu-tiny")
    p = tunekit.plan(cfg, "T4", precision="bf16", micro_batch=2, seq_len=64)
    # no bound from the bytes alone nor from fp16's peak: none, and no expected step
    assert p.peak_tflops is None and math.isnan(p.bound_step_s) and math.isnan(p.compute_bound_s)
    assert math.isnan(p.bound_tokens_per_s) and p.bound_by == [] and p.expected is None
    [note] = of_kind(p.notes, "device.no_peak")
    assert note == ("T4 lists no bf16 peak: no speed bound, no expected step; T4 has no bf16 tensor cores (they came "
                    "with Ampere, compute capability 8.0): its half precision is fp16 with a gradient scaler "
                    "(precision='fp16')")
    text = repr(p)
    assert "  bound      none: T4 lists no bf16 peak (the notes say what it runs instead)" in text
    # the components are listed as what they are, not as the parts of the peak (their sum is not it)
    assert (f"  peak       {p.peak_bytes / 2**30:.3f} GiB at {p.peak_at} + fixed costs; the components (each its "
            "largest over the step, not all alive at the peak) and the rest of the peak:") in text
    assert "upper bounds" not in text
    half = tunekit.plan(cfg, "T4", precision="fp16", micro_batch=2, seq_len=64)   # what it runs instead: bounded
    assert half.peak_tflops == 65 and half.bound_step_s > 0 and not of_kind(half.notes, "device.no_peak")
    # the command prints the same plan
    assert main(["plan", "--model", "cpu-tiny", "--device", "T4", "--precision", "bf16", "--micro-batch", "2",
                 "--seq-len", "64"]) == 0
    out = capsys.readouterr().out
    assert note in out and "bound      none: T4 lists no bf16 peak" in out and "upper bounds" not in out
    amd = tunekit.plan(cfg, "MI250X", precision="tf32", micro_batch=2, seq_len=64)   # CDNA2: no TF32
    assert math.isnan(amd.bound_step_s) and of_kind(amd.notes, "device.no_peak")[0].endswith(
        "MI250X (one GCD) has no TF32 (CDNA2; CDNA 3 added it): tf32 leaves its matmuls in fp32 (precision='fp32')")


@pytest.mark.parametrize("call, error, match", [
    (lambda: tunekit.plan(tunekit.GPTConfig.preset("cpu-tiny"), "H900"), ValueError, "unknown device 'H900'"),
    # a typo is refused with the row it looks like, not read as that row (it was, with a note)
    (lambda: tunekit.plan(tunekit.GPTConfig.preset("cpu-tiny"), "H100X"), ValueError,
     r"unknown device 'H100X': did you mean 'H100 SXM'\? \(the devices: "),
    # a dropped digit: the card of the same family, not the nearest string of the table ("A10G")
    (lambda: tunekit.plan(tunekit.GPTConfig.preset("cpu-tiny"), "H10"), ValueError,
     r"unknown device 'H10': did you mean 'H100 SXM'\? \(the devices: "),
    (lambda: tunekit.plan(torch.nn.Linear(2, 2)), TypeError, "needs batch_fn"),
    (lambda: tunekit.plan(tunekit.GPTConfig.preset("cpu-tiny"), "cpu", seq_len=10_000), ValueError, "positions"),
    (lambda: tunekit.plan(tunekit.GPTConfig.preset("cpu-tiny"), "cpu", precision="fp64"), ValueError, "precision"),
    (lambda: tunekit.plan(tunekit.GPTConfig.preset("cpu-tiny"), "cpu", micro_batch=0), ValueError, "micro_batch"),
])
def test_bad_input_is_refused_before_any_work(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_a_preset_name_plans_as_its_config_and_a_misspelled_one_names_the_preset_meant():
    from tunekit.planning.target import config_of
    # the name the command's --model and Lab(preset=) take: the preset's GPTConfig
    assert config_of("gpt2-124m") == (tunekit.GPTConfig.preset("gpt2-124m"), "gpt", {})
    with pytest.raises(ValueError, match=r"unknown preset 'gpt2-124': did you mean 'gpt2-124m'\?"):
        tunekit.plan("gpt2-124", "H100")


@pytest.mark.slow
def test_an_8b_llama_plans_for_an_h100_in_under_a_minute_with_little_memory():
    pytest.importorskip("transformers")
    # in a process of its own: its peak RSS is the plan's, not this test session's
    code = textwrap.dedent('''
        import json, resource, time, warnings
        warnings.filterwarnings("ignore")
        import tunekit
        from transformers import LlamaConfig
        cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                          num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192)
        t0 = time.perf_counter()
        p = tunekit.plan(cfg, "H100 SXM", precision="bf16", weights="bf16", micro_batch=1, seq_len=8192,
                         checkpointing=True)
        print(json.dumps(dict(s=time.perf_counter() - t0, rss_kib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                              weights=p.components["weights"], opt=p.components["optimizer_states"],
                              fits=p.fits, mfu=p.bound_mfu)))
    ''')
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert r["s"] < 120                     # ~5 s quiet on 2 cores; the target is 60 s
    assert r["rss_kib"] < 2 * 2**20         # under 2 GiB of real memory (~0.4 GiB seen)
    # 8,030,261,248 parameters in bf16: 14.96 GiB of weights; AdamW's two moments at least twice that
    assert r["weights"] == 8_030_261_248 * 2 and r["opt"] >= 4 * 8_030_261_248
    assert r["fits"] and r["mfu"] < 1


# --- tunekit plan (the command) ------------------------------------------------------------------

def test_the_command_plans_a_preset_and_says_whether_it_fits(capsys):
    from tunekit.cli.main import main

    assert main(["plan", "--model", "cpu-tiny", "--device", "T4", "--precision", "fp16", "--micro-batch", "4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("plan · GPT (n_layer=2, n_embd=128) on T4 · fp16 · micro-batch 4 x 128") and ": fits" in out
    # gpt-1b's AdamW state alone (8 bytes x ~1.2e9 parameters) is past a T4's 16 GB
    assert main(["plan", "--model", "gpt-1b", "--device", "T4", "--seq-len", "128"]) == 1
    assert "does NOT fit" in capsys.readouterr().out


def test_the_command_reads_a_transformers_config_and_refuses_bad_input(tmp_path, capsys):
    pytest.importorskip("transformers")
    import json

    from tunekit.cli.main import main

    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps({"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
                               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                               "max_position_embeddings": 64}))
    assert main(["plan", "--model", str(cfg), "--device", "cpu", "--precision", "fp32", "--micro-batch", "2"]) == 0
    assert "Llama (hidden=64, layers=2) on cpu" in capsys.readouterr().out
    assert main(["plan", "--device", "H900"]) == 2
    assert "unknown device 'H900'" in capsys.readouterr().err
    assert main(["plan", "--model", "os:getcwd"]) == 2
    assert "from a config" in capsys.readouterr().err


@pytest.mark.slow   # ~25 s: six fake steps of a 1B GPT (the search itself: tests/planning/test_plan_advice.py, fast)
def test_what_to_change_when_it_does_not_fit_is_tried_and_ranked():
    # gpt-1b, bf16 autocast over fp32 weights, 4 x 512 on a T4: 18.73 GiB of 15.0
    p = tunekit.plan(tunekit.GPTConfig.preset("gpt-1b"), "T4", precision="bf16", micro_batch=4, seq_len=512)
    assert not p.fits
    changes = [a[0] for a in p.alternatives]
    # each single change (the global batch kept: micro_batch halved, grad_accum doubled, down to 1); SGD is
    # not tried: 8-bit AdamW, the smaller change, fits with room (2.25 GiB free of 15)
    assert set(changes) == {"weights='bf16'", "checkpointing=True", "optimizer='adamw_8bit'",
                            "micro_batch=2, grad_accum=2", "micro_batch=1, grad_accum=4",
                            "parallel='fsdp', world_size=2"}
    assert "optimizer='sgd'" in [k.changes for k in p.not_tried]
    totals = {a[0]: a[1] for a in p.alternatives}
    assert list(totals.values()) == sorted(totals.values())   # the most saving first
    # each change saves memory but accumulation: its gradients (1B fp32, ~4 GiB) sit beside every
    # forward after the first micro-step, more than the halved activations give back on this model
    accumulating = {"micro_batch=2, grad_accum=2", "micro_batch=1, grad_accum=4"}
    assert all((t > p.total_bytes) == (c in accumulating) for c, t in totals.items())
    bf16 = next(a for a in p.alternatives if a[0] == "weights='bf16'")
    assert bf16[2] and bf16[3] == 1.0 and "try        weights='bf16'" in repr(p)
    # what fits is in plan.advice (tests/planning/test_plan_advice.py): the three single changes that fit,
    # each with room, so nothing is added to them; a T4 has no bf16 expectation: fewer GPUs, fewer bytes first
    fits = [a[0] for a in p.alternatives if a[2]]
    assert [o.label for o in p.advice] == ["weights='bf16'", "optimizer='adamw_8bit'", "parallel='fsdp', world_size=2"]
    assert set(fits) == {o.label for o in p.advice}
    assert [[kind_of(n) for n in o.notes] for o in p.advice] == [["advice.numerics"], ["advice.optimizer"],
                                                                  ["advice.gpus"]]
    assert "advice     3 combination(s) that fit, no expected speed on T4" in repr(p)


def test_a_step_that_reads_values_is_planned_analytically_and_says_why(monkeypatch):
    # Adafactor's step reads a value (.item()); with the fake step's answer to it turned off
    # (measure.torch_private.fake_scalar_reads: tests/planning/test_plan_adafactor.py) there is no
    # fake step, the analytic estimate instead (exact figures: tests/planning/test_plan_modules.py)
    from tunekit.measure import torch_private

    # the one check both steps ask (torch_private.fake_scalar_reads_for)
    monkeypatch.setattr(torch_private, "has_fake_params", lambda opt: False)
    p = tunekit.plan(tunekit.GPTConfig.preset("cpu-tiny"), "cpu", optimizer="adafactor", micro_batch=2, seq_len=32)
    assert p.method == "analytic" and p.notes[0].startswith("analytic estimate: the fake step failed because the "
                                                            "step reads a tensor's value")
    assert "· analytic" in repr(p).splitlines()[0]


def test_the_card_s_usable_memory_says_where_it_comes_from_and_aliases_are_said():
    from tunekit.core.specs import find_spec

    # the driver's totals where published; else the nominal size by the kind of memory
    assert find_spec("NVIDIA L4").usable[0] == 23034 * 2**20              # ECC: 15/16 of 24 GiB
    assert find_spec("RTX 4090").usable[0] == 24 * 2**30                  # no ECC
    assert find_spec("NVIDIA H200").usable[0] == 141 * 2**30 * 81559 / 81920   # 140.38 GiB
    assert "nominal" in find_spec("NVIDIA H200").usable[1]
    # the 40 GB A100 is a card of its own, and "A100" is read as the 80 GB one, visibly
    tiny = tunekit.GPTConfig.preset("cpu-tiny")
    small = tunekit.plan(tiny, "NVIDIA A100-SXM4-40GB", micro_batch=2, seq_len=64)
    assert (small.device, small.device_memory_bytes, small.bandwidth_tbs) == ("A100 40GB", 40960 * 2**20, 1.555)
    big = tunekit.plan(tiny, "A100", micro_batch=2, seq_len=64)
    assert big.device == "A100 80GB"
    assert any("device 'A100' read as A100 80GB (the table also has A100 40GB" in n for n in big.notes)
    assert not any("read as" in n for n in tunekit.plan(tiny, "A100 80GB", micro_batch=2, seq_len=64).notes)


def test_a_gpu_plan_names_kernel_categories_a_cpu_plan_its_ops():
    # issue 33: an H100 plan said 'bound by _scaled_dot_product_flash_attention_for_cpu_backward',
    # a CPU op of the fake step; a GPU plan names categories, their times the sums of their ops'
    from tunekit.core.breakdown import CATEGORIES, by_category

    cfg = tunekit.GPTConfig.preset("cpu-tiny")
    gpu = tunekit.plan(cfg, "H100 SXM", precision="bf16", micro_batch=2, seq_len=64)
    names = [n for n, _ in gpu.bound_by]
    assert names and set(names) <= set(CATEGORIES) and "matmul/linear" in names
    assert "for_cpu" not in repr(gpu)
    cpu = tunekit.plan(cfg, "cpu", micro_batch=2, seq_len=64)
    assert any(n.startswith("mm") for n, _ in cpu.bound_by)    # the CPU's own ops, by name
    # 2 + 1 matmul seconds, 0.5 attention: summed per category, the largest first
    assert by_category([("mm.default", 2.0), ("_scaled_dot_product_flash_attention_for_cpu_backward.default", 0.5),
                        ("bmm.default", 1.0)]) == [("matmul/linear", 3.0), ("attention", 0.5)]


def test_accumulated_gradients_sit_beside_the_next_micro_steps_forward():
    cfg = tunekit.GPTConfig.preset("cpu-tiny")
    one, two = (tunekit.plan(cfg, "H100", precision="bf16", micro_batch=4, seq_len=64, grad_accum=g, verbose=False)
                for g in (1, 2))
    # micro-step 2's forward runs beside every gradient micro-step 1 left (fp32, as the weights):
    # 4 bytes per parameter, each tensor rounded up to the CUDA allocator's 512-byte blocks
    grads = sum(-(-p.numel() * 4 // 512) * 512 for p in tunekit.GPT(cfg).parameters())
    assert two.phase_peaks["forward"] - one.phase_peaks["forward"] == grads
    assert two.phase_peaks["backward"] == one.phase_peaks["backward"]


def test_a_step_far_past_the_card_is_answered_from_the_formula_without_the_fake_step(monkeypatch):
    # gpt-1b at micro_batch 512 on a T4: estimate_memory's line is ~145x the card's 15 GiB, far over
    # FAR_PAST (2x): the plan is the formula's, said so, and no fake step (nor advice search) runs
    import tunekit.planning.planner as planner
    from tunekit.planning.analytic import FAR_PAST

    def no_fake_step(*a, **k):
        raise AssertionError("the fake step ran")

    monkeypatch.setattr(planner._Steps, "run", no_fake_step)
    cfg = tunekit.GPTConfig.preset("gpt-1b")
    p = tunekit.plan(cfg, "T4", micro_batch=512, seq_len=128, verbose=False)
    assert p.method == "analytic" and not p.fits and p.advice == []
    assert p.total_bytes > FAR_PAST * p.device_memory_bytes
    assert p.notes[0].startswith("formula's figure") and "not even micro_batch=1 fits" in p.notes[0]
    assert "formula's figure" in repr(p)   # the text says how it was computed, first
    big = tunekit.plan(cfg, "H100 SXM", micro_batch=512, seq_len=1024, verbose=False)   # the weights fit here
    fits = int(big.notes[0].split("micro_batch=")[1].split(" ")[0])   # the largest micro-batch the formula fits
    assert 0 < fits < 512 and not big.fits
    with pytest.raises(AssertionError, match="the fake step ran"):   # search=True asks for the fake step's search
        tunekit.plan(cfg, "T4", micro_batch=512, seq_len=128, verbose=False, search=True)
    # one sample is never cut short, however far past (FAR_PAST lowered to make this one so): the advice
    # (sharding, half weights) is its answer, and only the fake step searches it
    monkeypatch.setattr("tunekit.planning.analytic.FAR_PAST", 0.5)
    with pytest.raises(AssertionError, match="the fake step ran"):
        tunekit.plan(cfg, "T4", micro_batch=1, seq_len=128, verbose=False)
