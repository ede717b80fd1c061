"""tunekit.Monitor on the inputs a first-use review tried: models called with dicts and lists, eval
forwards, frozen weights, compile, loops left half-way, bad scalars, epochs. Each checks a number
is right or honestly unknown (NaN), never silently wrong."""
import math
import warnings

import numpy as np
import pytest
import torch

import tunekit
from tunekit.measure.flops import counting_active


def _llama():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=4)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.AutoModelForCausalLM.from_config(cfg)


def _ids(s, b=2):
    ids = torch.randint(0, 256, (b, s))
    return {"input_ids": ids, "labels": ids}


# --- wrong numbers --------------------------------------------------------------------------

def test_grad_accumulation_later_microbatch_shapes_change_the_flops():
    """The first forward's shapes cannot tell a step whose 2nd micro-batch is longer: that step
    gets no executed FLOPs (not the short step's), and the next step with those shapes is counted."""
    m = _llama()
    mon = tunekit.Monitor(m, live=False, warmup=0)
    for s2 in (16, 128, 128):
        with mon.step():
            for s in (16, s2):
                m(**_ids(s)).loss.backward()
    mon.close()
    a, b, c = mon.rows
    assert math.isnan(b["flops"]) and b["flops_source"] == "none"
    assert c["counted"] and c["flops"] > a["flops"] and c["flops"] >= c["model_flops"]
    assert any("inputs changed after its first forward" in n for n in mon.notes)


def test_custom_module_taking_a_dict_counts_flops_per_shape():
    """model(batch_dict): the signature looks inside the dict, so 64x longer inputs are counted anew."""
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.out = torch.nn.Embedding(256, 32), torch.nn.Linear(32, 256)

        def forward(self, b):
            return self.out(self.emb(b["ids"])).mean()

    net = Net()
    mon = tunekit.Monitor(net, live=False, warmup=0)
    for s in (8, 512):
        b = {"ids": torch.randint(0, 256, (4, s))}
        with mon.step():
            net(b).backward()
    mon.close()
    assert mon.rows[0]["flops"] != mon.rows[1]["flops"]


def test_list_of_images_samples_and_flops():
    """A detection-style model(list_of_images): 4 images are 4 samples (not the 3 channels of the
    first), and 128x128 images get their own count, not the 32x32 one."""
    class Det(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.nn.Conv2d(3, 8, 3)

        def forward(self, imgs):
            return sum(self.c(i[None]).sum() for i in imgs)

    d = Det()
    mon = tunekit.Monitor(d, live=False, warmup=0)
    for hw in (32, 128):
        imgs = [torch.randn(3, hw, hw) for _ in range(4)]
        with mon.step():
            d(imgs).backward()
    mon.close()
    assert all(math.isnan(r["samples"]) or r["samples"] == 4 for r in mon.rows)
    assert mon.rows[0]["flops"] != mon.rows[1]["flops"]


def test_submodules_called_directly_count_samples_once():
    """features = model.backbone(x); model.head(features): samples come from the entry module only."""
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.AdaptiveAvgPool2d(1),
                                                torch.nn.Flatten())
            self.head = torch.nn.Linear(8, 10)

        def forward(self, x):
            return self.head(self.backbone(x))

    net = Net()
    mon = tunekit.Monitor(net, live=False, warmup=0)
    with mon.step():
        x = torch.randn(16, 3, 16, 16)
        net.head(net.backbone(x)).sum().backward()
    mon.close()
    assert mon.rows[0]["samples"] == 16   # got 32


def test_eval_forward_under_no_grad_is_not_training_throughput():
    """A validation forward (no grad) inside a step adds nothing to the training tokens, and the step
    never reuses a count of a step without it (no FLOPs rather than too few)."""
    m = _llama()
    mon = tunekit.Monitor(m, live=False, warmup=0)
    for i in range(2):
        with mon.step():
            m(**_ids(32)).loss.backward()
            if i == 1:
                with torch.no_grad():
                    m(**_ids(32, b=8))
    mon.close()
    a, b = mon.rows
    assert b["tokens"] == a["tokens"]          # 64 training tokens; got 320
    assert math.isnan(b["flops"]) or b["flops"] >= b["model_flops"]   # new inputs: no count, never a low one


def test_frozen_parameters_mfu_not_above_hfu():
    """Only lm_head trained: the analytic 6N would exceed what ran, so MFU comes from the count (<= HFU)."""
    m = _llama()
    for n, p in m.named_parameters():
        p.requires_grad = "lm_head" in n
    ids = torch.randint(0, 256, (2, 32))
    mon = tunekit.Monitor(m, live=False, warmup=0)
    for _ in range(3):
        with mon.step():
            m(input_ids=ids, labels=ids).loss.backward()
    mon.close()
    r = mon.rows[-1]
    assert r["model_flops"] <= r["flops"]
    assert r["mfu"] <= r["hfu"]


def test_compiled_model_compile_time_is_not_a_measured_step():
    """Step 0 runs eagerly under the FLOP counter, so Dynamo compiles in step 1: that step is the
    warm-up (and any step that compiles is marked so), never a measured one."""
    net = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    cm = torch.compile(net)
    mon = tunekit.Monitor(cm, live=False)
    for _ in range(5):
        with mon.step():
            cm(torch.randn(8, 16)).sum().backward()
    mon.close()
    walls = [r["wall_s"] for r in mon.rows if not r["warmup"] and not r["counted"]]
    assert max(walls) < 20 * sorted(walls)[len(walls) // 2]   # no compile inside a measured step


def test_more_than_16_shapes_summary_keeps_mfu_and_says_why_flops_stopped():
    """Past MAX_COUNTS shapes the summary keeps MFU (from the model's shape) and a note says the
    FLOP count stopped after 16 shapes."""
    m = _llama()
    mon = tunekit.Monitor(m, live=False, warmup=0)
    for s in range(8, 8 + 20):
        with mon.step():
            m(**_ids(s)).loss.backward()
    mon.close()
    assert any(r["mfu"] == r["mfu"] for r in mon.rows)
    assert mon.summary.mfu == mon.summary.mfu
    assert any("16" in n for n in mon.notes + mon.summary.notes)


def test_arithmetic_of_rows():
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    mon = tunekit.Monitor(net, live=False)
    for x in mon.iter([torch.randn(16, 32) for _ in range(6)]):
        net(x).sum().backward()
    mon.close()
    for r in mon.rows[2:]:   # 0 counted, 1 warm-up
        assert r["samples_per_s"] == pytest.approx(r["samples"] / r["wall_s"])
        assert r["mfu"] == pytest.approx(r["model_flops"] / r["wall_s"] / 1e12 / mon.peak_tflops)
        assert r["flops"] == mon.rows[0]["flops"]


# --- failures, hooks, counters left behind ------------------------------------------------

def test_break_with_iterator_held_leaves_no_flop_counter_running():
    """it = mon.iter(loader); for x in it: ...; break: the count ended at the optimizer step, and the
    next step ends the abandoned one instead of refusing."""
    net = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    mon = tunekit.Monitor(net, live=False)
    it = mon.iter([torch.randn(4, 8) for _ in range(5)])
    for x in it:
        net(x).sum().backward()
        opt.step()                # the count ends at the step's optimizer step
        break
    try:
        assert not counting_active()
        with mon.step():          # raised: "a step is already going"
            net(torch.randn(4, 8))
    finally:
        mon.close()
        del it


def test_break_is_not_an_error_of_the_run():
    """Leaving the loop early with break (max_steps) is no failure of the run."""
    net = torch.nn.Linear(8, 2)
    mon = tunekit.Monitor(net, live=False)
    for i, x in enumerate(mon.iter([torch.randn(4, 8) for _ in range(5)])):
        if i == 3:
            break
        net(x).sum().backward()
    rec = mon.close()
    assert rec.error is None
    assert mon.summary.failed == 0


def test_loader_error_is_recorded():
    """The loader raising mid-way is the run's error in its record."""
    net = torch.nn.Linear(8, 2)

    def bad():
        yield torch.randn(4, 8)
        yield torch.randn(4, 8)
        raise OSError("disk gone")

    mon = tunekit.Monitor(net, live=False)
    with pytest.raises(OSError):
        for x in mon.iter(bad()):
            net(x).sum().backward()
    rec = mon.close()
    assert rec.error is not None


def test_hooks_removed_after_exception_without_close():
    """A second Monitor on the same model (a notebook cell run again) closes the first: one set of hooks."""
    net = torch.nn.Linear(8, 2)
    for _ in range(2):
        mon = tunekit.Monitor(net, live=False)
        with pytest.raises(ValueError):
            for x in mon.iter([torch.randn(4, 8)] * 3):
                net(x)
                raise ValueError("boom")
    assert len(net._forward_pre_hooks) <= 1


def test_exception_in_step_recorded_and_nothing_left():
    net = torch.nn.Linear(8, 2)
    mon = tunekit.Monitor(net, live=False)
    with pytest.raises(KeyboardInterrupt):
        with mon.step():
            net(torch.randn(4, 8))
            raise KeyboardInterrupt
    assert mon.rows[-1]["error"] == "KeyboardInterrupt"
    assert not counting_active()
    rec = mon.close()
    assert mon.close() is rec
    assert len(net._forward_pre_hooks) == 0


# --- log() ---------------------------------------------------------------------------------

def test_log_non_scalar_tensor_is_refused_not_nan():
    net = torch.nn.Linear(8, 2)
    mon = tunekit.Monitor(net, live=False)
    with pytest.raises(ValueError):
        with mon.step():
            mon.log(v=torch.randn(3))
    mon.close()


@pytest.mark.parametrize("v", [np.float32(1.5), np.int64(3)])
def test_log_numpy_scalars_like_float64(v):
    """numpy scalars of every width are numbers, as np.float64 is."""
    net = torch.nn.Linear(8, 2)
    mon = tunekit.Monitor(net, live=False)
    with mon.step():
        mon.log(v=v)
    mon.close()
    assert mon.rows[-1]["v"] == float(v)


def test_log_bool_consistent():
    """A bool is no measurement: refused as a Python bool and as a bool tensor alike."""
    net = torch.nn.Linear(8, 2)
    mon = tunekit.Monitor(net, live=False)
    results = []
    for v in (True, torch.tensor(True)):
        try:
            with mon.step():
                mon.log(ok=v)
            results.append("accepted")
        except ValueError:
            results.append("refused")
            if mon._open is not None:
                mon.end_step()
    mon.close()
    assert results[0] == results[1]


def test_log_after_close_is_refused():
    net = torch.nn.Linear(8, 2)
    mon = tunekit.Monitor(net, live=False)
    with mon.step():
        net(torch.randn(4, 8))
    mon.close()
    with pytest.raises(RuntimeError):
        mon.log(loss=1.0)   # silently changes a row of a run whose record is already made


# --- output --------------------------------------------------------------------------------

def test_second_epoch_progress_is_not_past_total():
    """mon.iter(loader) once per epoch: the total grows by each epoch's len(loader)."""
    from tunekit.monitor.view import status

    net = torch.nn.Linear(8, 2)
    mon = tunekit.Monitor(net, live=False)
    for _ in range(3):
        for x in mon.iter([torch.randn(4, 8)] * 4):
            net(x)
    mon.close()
    line = status("run", mon.rows, mon.total, 3.0, None)
    assert "12/4" not in line


def test_import_prints_nothing():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "import torch, tunekit"], capture_output=True, text=True)
    assert out.stdout == "" and out.stderr == ""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_first_parameter_on_cpu_model_on_cuda_still_synchronizes():
    """Any CUDA parameter makes the monitor synchronize that device at each step's end."""
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(1))                 # stays on CPU
            self.lin = torch.nn.Linear(4096, 4096).cuda()

        def forward(self, x):
            for _ in range(50):
                x = self.lin(x)
            return x

    m = M()
    mon = tunekit.Monitor(m, live=False)
    assert mon.cuda_index is not None
    mon.close()


def test_token_ids_counted_as_samples_get_a_one_time_hint_about_tokens():
    # issue 33: a plain-torch model fed (B, S) token ids reported samples/s with no word about tokens=
    class Lm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.out = torch.nn.Embedding(64, 16), torch.nn.Linear(16, 64)

        def forward(self, ids):
            return self.out(self.emb(ids)).logsumexp(-1).mean()

    model = Lm()
    hint = ("samples/s: the model's input looks like token ids (4 x 8 integers); Monitor(..., tokens=32) or "
            "mon.step(tokens=...) gives tokens/s and MFU per token")   # 4 x 8 = 32 tokens a step
    mon = tunekit.Monitor(model, live=False, peak=1.0)
    for ids in mon.iter([torch.randint(0, 64, (4, 8)) for _ in range(3)]):
        model(ids).backward()
    rec = mon.close()
    assert all(r["samples"] == 4 and r["tokens"] != r["tokens"] for r in mon.rows)   # 4 samples, tokens NaN
    assert rec.notes.count(hint) == 1
    given = tunekit.Monitor(model, live=False, peak=1.0, tokens=32)
    for ids in given.iter([torch.randint(0, 64, (4, 8)) for _ in range(2)]):
        model(ids).backward()
    assert not any("looks like token ids" in str(n) for n in given.close().notes)
    floats = tunekit.Monitor(torch.nn.Linear(8, 2), live=False, peak=1.0)   # (B, F) floats are features
    for x in floats.iter([torch.randn(4, 8) for _ in range(2)]):
        floats.model(x).sum().backward()
    assert not any("looks like token ids" in str(n) for n in floats.close().notes)
