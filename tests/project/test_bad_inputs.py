"""Bad input at every public door: a Lab's model, functions and devices are checked at
construction (one tiny dry step, nothing of the model changed), every state file of any shape is
ignored with one warning, and numeric and device arguments outside their meaning are refused."""
import dataclasses
import hashlib
import json
import os
import random
import threading
import time
import warnings

import numpy as np
import pytest
import torch

import tunekit
from tunekit.core.toggles import ToggleError
from tunekit.lab import runlog
from tunekit.lab.lab import Lab
from tunekit.measure import mamf_cache, peaks
from tunekit.models import data


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
    return Lab(MLP() if model is None else model, **{"log_path": tmp_path / "r.jsonl", "peak_tflops": 1.0, **kw})


# --- item 4: a Lab's inputs, checked at construction ------------------------------------------


@pytest.mark.parametrize("kw,error,message", [
    ({"model": MLP}, TypeError,
     "model is the class MLP, not a model: pass an instance, e.g. MLP(...) instead of MLP"),
    ({"model": 42}, TypeError,
     "model must be None, an nn.Module instance or a factory 'package.module:function', got int 42"),
    ({"model": "gpt"}, ValueError,   # a name that is neither a factory nor a preset: what a name can be
     "a model given by name is a factory 'package.module:function' (an importable function that returns the "
     "nn.Module), got 'gpt'; the built-in GPT needs no name, its sizes are presets (cpu-tiny, cpu-small, "
     "gpt2-124m, gpt2-350m, gpt-1b); a transformers model: build it from its config and give the module"),
    ({"batch_fn": 3, "loss_fn": mse}, TypeError,
     "batch_fn must be a function (micro_batch, seq_len) -> (x, y), got int 3"),
    ({"batch_fn": batches, "loss_fn": 4}, TypeError, "loss_fn must be a function (model, x, y) -> loss, got int 4"),
    ({"batch_fn": MLP, "loss_fn": mse}, TypeError, "batch_fn must be a function (micro_batch, seq_len) -> (x, y), "
                                                   f"got type {MLP}"),
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
     "Lab(...) defaults: micro_batch must be a whole number >= 1, got 0: a step needs at least one sample"),
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


# every constructor names the keyword a user probably meant: a misspelled one (the closest name), or
# a value its keyword refuses and another takes (the keyword that takes it)
MEANT = [
    (lambda: Lab("gpt2-124m"), ValueError,
     "Lab(): model='gpt2-124m' is not what model takes: did you mean preset='gpt2-124m'?"),
    (lambda: Lab(presett="gpt2-124m"), TypeError,
     "Lab() got an unexpected keyword argument 'presett': did you mean preset='gpt2-124m'?"),
    (lambda: Lab(device="bf16"), ValueError,
     "Lab(): device='bf16' is not what device takes: did you mean precision='bf16'?"),
    (lambda: Lab(dtype="bf16"), TypeError,    # no name close to dtype: the value says which
     "Lab() got an unexpected keyword argument 'dtype': did you mean precision='bf16'?"),
    (lambda: tunekit.Monitor(MLP(), precision="bf16"), TypeError,
     "Monitor() got an unexpected keyword argument 'precision': did you mean dtype='bf16'?"),
    (lambda: tunekit.plan("cpu-tiny", "cpu", precison="bf16"), TypeError,
     "plan() got an unexpected keyword argument 'precison': did you mean precision='bf16'?"),
    (lambda: tunekit.plan("cpu-tiny", "cpu", attention="bf16"), ValueError,
     "plan(): attention='bf16' is not what attention takes: did you mean precision='bf16'?"),
    (lambda: tunekit.Setting(weights="tf32"), ValueError,
     "Setting(): weights='tf32' is not what weights takes: did you mean precision='tf32'?"),
    (lambda: tunekit.Setting(micro_bach=4), TypeError,
     "Setting() got an unexpected keyword argument 'micro_bach': did you mean micro_batch=4?"),
    (lambda: tunekit.Setting(colour=4), TypeError,      # nothing close, no keyword takes 4 by its choices
     "Setting() got an unexpected keyword argument 'colour'; it takes precision, checkpointing, micro_batch, "),
    (lambda: tunekit.Setting().replace(precison="bf16"), TypeError,
     "unknown toggle(s) ['precison']: did you mean precision='bf16'?"),
    (lambda: Lab().run(stps=3), TypeError,        # a run argument, not a toggle, misspelled
     "Lab.run() got an unexpected keyword argument 'stps': did you mean steps=3?"),
    (lambda: Lab().expect(checkpoint=True), TypeError,
     "Lab.expect() got an unexpected keyword argument 'checkpoint': did you mean checkpointing=True?"),
    (lambda: Lab().find_max_batch_size(limt=64), TypeError,
     "Lab.find_max_batch_size() got an unexpected keyword argument 'limt': did you mean limit=64?"),
    (lambda: Lab().autotune(budget=30), TypeError,
     "Lab.autotune() got an unexpected keyword argument 'budget': did you mean budget_s=30?"),
]


@pytest.mark.parametrize("call, error, message", MEANT)
def test_every_constructor_names_the_keyword_meant(call, error, message):
    with pytest.raises(error) as info:
        call()
    assert str(info.value).startswith(message), str(info.value)


def test_a_value_its_own_keyword_takes_gets_no_help():
    # "bf16" is both a precision and a weights dtype; "fp32" weights are taken though the dropdown lacks them
    assert tunekit.Setting(precision="bf16", weights="fp32").weights == "fp32"
    from tunekit.core.validate import meant
    assert meant("precision", "bf16", ("precision", "weights"), {"precision": ("bf16",), "weights": ("bf16",)}) == ""


NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
MISSING = "this machine has no CUDA device (torch sees none); use 'cpu' here, or run where one is"


@NO_CUDA
@pytest.mark.parametrize("device", ["cuda", "cuda:1", torch.device("cuda"), 0])
def test_a_lab_on_a_missing_cuda_device_is_refused_with_what_to_do(tmp_path, device):
    with pytest.raises(ValueError) as info:
        _lab(tmp_path, batch_fn=batches, loss_fn=mse, device=device)
    assert str(info.value) == f"device={device!r}: {MISSING}"


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


# --- item 7: state files of any shape are ignored with one warning ----------------------------


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh calibration cache folder; calibrations take a 64x64 sweep (milliseconds)."""
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(peaks, "default_sizes", lambda device_type: [64])
    monkeypatch.setattr(peaks, "_rechecked", {})
    (tmp_path / "cache").mkdir()
    return tmp_path / "cache" / "mamf.json"


def _entry(dtype, change=None):
    """(key, entry) of a calibration as calibrate() writes it: 1000 TFLOPS, far above what a
    re-check can reach, so that a run that uses it reports exactly 1000."""
    name = peaks.device_name("cpu")
    cal = peaks.Calibration(device=name, dtype=dtype, tflops=1000.0, best_shape=(64, 64, 64),
                            sweep=[(64, 64, 64, 1000.0)], seconds=0.1, torch_version=torch.__version__,
                            threads=torch.get_num_threads(), busy=0.0, layout="nt", taken_at=time.time())
    return peaks._cache_key(name, dtype), json.loads(json.dumps({**dataclasses.asdict(cal), **(change or {})}))


def _one_warning(record, words):
    msgs = [str(w.message) for w in record if "tunekit" in str(w.message)]
    assert len(msgs) == 1 and words in msgs[0], msgs
    return msgs[0]


BAD_ENTRIES = {
    "tflops a string": {"tflops": "fast"}, "tflops NaN": {"tflops": float("nan")}, "tflops < 0": {"tflops": -3.0},
    "tflops infinite": {"tflops": float("inf")}, "threads a bool": {"threads": True},
    "threads 0": {"threads": 0}, "best_shape of 2": {"best_shape": [64, 64]},
    "best_shape of floats": {"best_shape": [64.5, 64, 64]}, "sweep a string": {"sweep": "fast"},
    "sweep row junk": {"sweep": [[64, 64, "x", 1.0]]}, "layout unknown": {"layout": "tn"},
    "dtype unknown": {"dtype": "int3"}, "device a number": {"device": 3}, "busy negative": {"busy": -1.0},
    "taken_at null": {"taken_at": None}, "an extra field": {"note": "hand-edited"},
    "under another entry's key": {"device": "some other CPU"},
}


@pytest.mark.parametrize("change", BAD_ENTRIES.values(), ids=BAD_ENTRIES.keys())
def test_a_bad_calibration_entry_is_ignored_and_changes_no_result(cache, change):
    good_key, good = _entry("fp32")
    bad_key, bad = _entry("bf16", change)
    cache.write_text(json.dumps({good_key: good, bad_key: bad}))
    with pytest.warns(UserWarning) as record:
        assert peaks.cached_calibration("cpu", "bf16") is None
    _one_warning(record, f"ignored the calibration cache {cache} where 1 of its 2 entries are not calibrations; "
                         "those calibrations are measured again")
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # one warning: the same file is not judged again
        assert peaks.resolve_peak("cpu", "fp32") == peaks.Peak(
            1000.0, f"calibrated MAMF on {good['device']}, fp32, best 64x64x64 matmul "
                    f"({good['threads']} threads, B transposed as nn.Linear keeps it)", "calibrated")
        with tunekit.profile(name="after junk", flops="never", model_flops=1e6, dtype="fp32") as rec:
            torch.ones(4).sum()
    assert rec.peak_tflops == 1000.0 and rec.error is None


@pytest.mark.parametrize("missing", ["tflops", "taken_at", "layout", "sweep"])
def test_an_entry_missing_a_field_is_measured_again(cache, missing):
    key, entry = _entry("fp32")
    del entry[missing]
    cache.write_text(json.dumps({key: entry}))
    with pytest.warns(UserWarning, match="1 of its 1 entries are not calibrations"):
        cal = tunekit.calibrate("fp32", device="cpu")
    assert cal.best_shape == (64, 64, 64) and cal.tflops != 1000.0   # measured, not the damaged entry
    cached = peaks.cached_calibration("cpu", "fp32")                 # and cached in its place
    assert (cached.tflops, cached.taken_at) == (cal.tflops, cal.taken_at)


BAD_FILES = {
    "binary junk": b"\x00\xff\xfe\x89PNG\r\n", "not JSON": b"tflops = 1000", "cut short": b'{"AMD|fp32": {"tfl',
    "empty": b"", "a JSON list": b"[1, 2, 3]", "JSON null": b"null", "a JSON string": b'"fast"',
    "latin-1 text": "{\"caf\xe9\": 1}".encode("latin-1"),
}


@pytest.mark.parametrize("content", BAD_FILES.values(), ids=BAD_FILES.keys())
def test_a_junk_calibration_file_is_ignored_then_replaced(cache, content):
    cache.write_bytes(content)
    with pytest.warns(UserWarning) as record:
        assert mamf_cache.load() == {}
    msg = _one_warning(record, f"ignored the calibration cache {cache} where it ")
    assert msg.endswith("; those calibrations are measured again")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cal = tunekit.calibrate("fp32", device="cpu")     # measured and written over the junk
        cached = peaks.cached_calibration("cpu", "fp32")
    assert (cached.tflops, cached.taken_at) == (cal.tflops, cal.taken_at)


def _within(seconds, fn):
    """fn() in a thread; fails (instead of hanging the suite) if it blocks, e.g. on a FIFO."""
    out = {}

    def target():
        try:
            out["value"] = fn()
        except BaseException as e:   # handed to the caller, as a direct call would raise it
            out["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{fn} blocked"
    if "error" in out:
        raise out["error"]
    return out["value"]


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_calibration_cache_that_is_no_file_is_never_opened(cache, kind):
    os.mkdir(cache) if kind == "directory" else os.mkfifo(cache)
    with pytest.warns(UserWarning) as record:
        assert _within(10, mamf_cache.load) == {}
    _one_warning(record, f"ignored the calibration cache {cache} where it is not a regular file")
    assert _within(10, lambda: peaks.resolve_peak("cpu", "fp32", allow_calibration=False)).tflops is None


# --- run logs ---------------------------------------------------------------------------------


BAD_LINES = {
    "binary junk": b"\x00\xff\xfe garbage", "cut short": b'{"schema": 1, "run_id": 3, "lo', "a JSON list": b"[1, 2]",
    "a JSON string": b'"run"', "no schema": b'{"run_id": 5, "label": "x"}',
    "schema a bool": b'{"schema": true, "run_id": 5}', "run_id a string": b'{"schema": 1, "run_id": "5"}',
    "tokens_per_s a string": b'{"schema": 1, "run_id": 5, "tokens_per_s": "fast"}',
    "step_s a bool": b'{"schema": 1, "run_id": 5, "step_s": true}',
    "notes of numbers": b'{"schema": 1, "run_id": 5, "notes": [1, 2]}',
    "notes a string": b'{"schema": 1, "run_id": 5, "notes": "slow"}',
    "micro_batch a float": b'{"schema": 1, "run_id": 5, "micro_batch": 2.5}',
    "precision a number": b'{"schema": 1, "run_id": 5, "precision": 16}',
    "nested toggles junk": b'{"schema": 1, "run_id": 5, "toggles": {"lr": "fast"}}',
    "toggles a list": b'{"schema": 1, "run_id": 5, "toggles": [1]}',
    "conditions junk": b'{"schema": 1, "run_id": 5, "conditions": {"verdict": "busy", "reason": "x", '
                       b'"cpu_wait": "lots"}}',
    "conditions a string": b'{"schema": 1, "run_id": 5, "conditions": "busy"}',
    "trace junk": b'{"schema": 1, "run_id": 5, "trace": {"device": "cpu", "seconds": {"matmul": "x"}, '
                  b'"wall_s": 1}}',
    "trace a string": b'{"schema": 1, "run_id": 5, "trace": "fast"}',
    "losses of strings": b'{"schema": 1, "run_id": 5, "losses": ["a"]}',
    "status a bool": b'{"schema": 1, "run_id": 5, "status": true}',
}


def _log_with(path, line: bytes) -> None:
    runlog.append_record(path, {"run_id": 0, "label": "baseline", "tokens_per_s": 1000.0, "step_s": 0.5,
                                "notes": ["kept"]})
    with open(path, "ab") as f:
        f.write(line + b"\n")


@pytest.mark.parametrize("line", BAD_LINES.values(), ids=BAD_LINES.keys())
def test_a_bad_run_log_line_is_skipped_with_one_warning(tmp_path, line):
    path = tmp_path / "runs.jsonl"
    _log_with(path, line)
    assert [r["run_id"] for r in runlog.read_records(path)[0]] == [0]
    with pytest.warns(UserWarning) as record:
        df = Lab.load_results(path, all=True)
    _one_warning(record, f"1 line(s) of {path} are not run records (cut short by a crash, not JSON, or a field of "
                         "the wrong type): skipped")
    assert df[["run_id", "label", "tokens_per_s", "notes"]].values.tolist() == [[0, "baseline", 1000.0, "kept"]]
    with pytest.warns(UserWarning, match="1 line"):
        lab = _lab(tmp_path, batch_fn=batches, loss_fn=mse, log_path=path)
    r = lab.run(steps=1, warmup=0, micro_batch=2)
    assert r.run_id == 1 and lab.results()["run_id"].tolist() == [0, 1]   # the junk took no id


def test_a_record_with_fields_from_a_newer_tunekit_still_loads(tmp_path):
    path = tmp_path / "runs.jsonl"
    _log_with(path, b'{"schema": 2, "run_id": 1, "label": "new", "from_the_future": {"x": 1}}')
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Lab.load_results(path)["label"].tolist() == ["baseline", "new"]


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_run_log_that_is_no_file_never_blocks_and_says_so(tmp_path, kind):
    path = tmp_path / "runs.jsonl"
    os.mkdir(path) if kind == "directory" else os.mkfifo(path)
    what = "a directory" if kind == "directory" else "a FIFO"
    if kind == "directory":   # a folder is refused outright (issue 33: test_a_lab_refuses_a_log_path_...)
        with pytest.raises(ValueError, match="is a folder, not a run log"):
            _lab(tmp_path, batch_fn=batches, loss_fn=mse, log_path=path)
        with pytest.raises(FileNotFoundError, match=rf"^no run log at {path} \(it is {what}\)$"):
            Lab.load_results(path)
        return
    with pytest.warns(UserWarning) as record:
        lab = _within(30, lambda: _lab(tmp_path, batch_fn=batches, loss_fn=mse, log_path=path))
    _one_warning(record, f"{path} is {what}, not a run log: no runs read from it")
    with pytest.raises(OSError, match=f"the run log {path} cannot be written"):
        _within(30, lambda: lab.log.check_writable())
    assert lab.optimizer is None   # refused before any training
    with pytest.raises(FileNotFoundError, match=rf"^no run log at {path} \(it is {what}\)$"):
        Lab.load_results(path)


def test_the_newest_log_skips_what_is_no_file(tmp_path):
    _log_with(tmp_path / "lab-a.jsonl", b"")
    time.sleep(0.01)
    os.mkfifo(tmp_path / "lab-z.jsonl")          # newer, but no log
    runs = _within(10, lambda: runlog.RunLog.newest(tmp_path))
    assert [r.label for r in runs] == ["baseline"]


# --- the corpus cache -------------------------------------------------------------------------


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEKIT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path / "cache"))   # the corpus is a cache
    path = data.corpus_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


@pytest.mark.parametrize("content", [b"", b"\x00\xff junk", b"# ---- os.py ----\nimport sys"],
                         ids=["empty", "binary junk", "cut short"])
def test_a_junk_corpus_cache_is_rebuilt_and_trains_on_the_same_bytes(data_dir, content):
    expected = hashlib.sha256(b"".join(b"# ---- " + p.name.encode() + b" ----\n" + p.read_bytes().rstrip(b"\n")
                                       + b"\n\n" for p in data._stdlib_sources())).hexdigest()
    data_dir.write_bytes(content)
    with pytest.warns(UserWarning) as record:
        blob = data.corpus_bytes()
    _one_warning(record, f"the corpus cache {data_dir} was not a corpus tunekit wrote: built again")
    assert hashlib.sha256(blob).hexdigest() == expected and data_dir.read_bytes() == blob


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_corpus_cache_that_is_no_file_is_never_opened(data_dir, kind):
    os.mkdir(data_dir) if kind == "directory" else os.mkfifo(data_dir)
    with pytest.warns(UserWarning) as record:
        blob = _within(60, data.corpus_bytes)
    msg = _one_warning(record, f"the corpus cache {data_dir} was not a corpus tunekit wrote")
    assert blob.startswith(b"# ---- ") and ("cannot be written" in msg) == (kind == "directory")


# --- numeric and device arguments of the public API -------------------------------------------


def _tiny_gpt():
    return tunekit.GPT(tunekit.GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16))


NAN, INF = float("nan"), float("inf")
BAD_CALLS = {
    "estimate: negative fraction": (lambda: tunekit.estimate_memory(1e9, overhead_fraction=-0.5),
                                    "overhead_fraction must be a finite number >= 0 and <= 1, got -0.5"),
    "estimate: fraction > 1": (lambda: tunekit.estimate_memory(1e9, overhead_fraction=1.5),
                               "overhead_fraction must be a finite number >= 0 and <= 1, got 1.5"),
    "estimate: fraction NaN": (lambda: tunekit.estimate_memory(1e9, overhead_fraction=NAN),
                               "overhead_fraction must be a finite number >= 0 and <= 1, got nan"),
    "estimate: negative context": (lambda: tunekit.estimate_memory(1e9, cuda_context_bytes=-1),
                                   "cuda_context_bytes must be a finite number >= 0, got -1"),
    "estimate: infinite optimizer bytes": (lambda: tunekit.estimate_memory(1e9, optimizer_bytes=INF),
                                           "optimizer_bytes must be a finite number >= 0, got inf"),
    "estimate: NaN grad bytes": (lambda: tunekit.estimate_memory(1e9, grad_bytes=NAN),
                                 "grad_bytes must be a finite number >= 0, got nan"),
    "estimate: unknown device": (lambda: tunekit.estimate_memory(1e9, device="gpu"),
                                 "device must be one of ('cpu', 'cuda', 'mps'), optionally with an index ('cuda:1'), "
                                 "or a torch.device, got 'gpu'"),
    "estimate: world_size 0": (lambda: tunekit.estimate_memory(1e9, world_size=0),
                               "world_size must be a whole number >= 1, got 0"),
    "estimate: a layout without parallel=": (
        lambda: tunekit.estimate_memory(1e9, world_size=4, nodes=2),
        "world_size=4 and nodes=2 describe a sharded run: give parallel='ddp', 'fsdp', 'fsdp_grad_op' or 'hsdp' "
        "with them (or zero_stage= and dp=)"),
    "estimate: tp a bool": (lambda: tunekit.estimate_memory(1e9, tp=True), "tp must be a positive integer, got True"),
    "estimate: zero_stage a bool": (lambda: tunekit.estimate_memory(1e9, zero_stage=True),
                                    "zero_stage must be 0, 1, 2 or 3, got True"),
    "estimate: checkpointing a word": (lambda: tunekit.estimate_memory(1e9, checkpointing="yes"),
                                       "checkpointing must be True or False, got 'yes'"),
    "resolve_peak: negative given": (lambda: tunekit.measure.resolve_peak("cpu", given=-1),
                                     "given must be a finite number > 0, got -1"),
    "resolve_peak: NaN given": (lambda: tunekit.measure.resolve_peak("cpu", given=NAN),
                                "given must be a finite number > 0, got nan"),
    "resolve_peak: allow_calibration a word": (lambda: tunekit.measure.resolve_peak("cpu", allow_calibration="no"),
                                               "allow_calibration must be True or False, got 'no'"),
    "calibrate: the meta device": (lambda: tunekit.calibrate("fp32", device="meta"),
                                   "device must be one of ('cpu', 'cuda', 'mps'), optionally with an index "
                                   "('cuda:1'), or a torch.device, got 'meta'"),
    "peak_tflops: a second CPU": (lambda: tunekit.peak_tflops("cpu:1"),
                                  "device='cpu:1': this machine has 1 CPU device(s), indices 0 to 0; to read a "
                                  "device's spec sheet from anywhere, give its name: "
                                  "peak_tflops('NVIDIA H100 80GB HBM3')"),
    "time_repeats: unknown device": (lambda: tunekit.measure.time_repeats(lambda: None, device="gpu"),
                                     "device must be one of ('cpu', 'cuda', 'mps'), optionally with an index "
                                     "('cuda:1'), or a torch.device, got 'gpu'"),
    "verdict: negative floor": (lambda: tunekit.verdict([1, 1.1], [1, 1.1], floor=-0.1),
                                "floor must be a finite number >= 0 and < 1, got -0.1"),
    "verdict: infinite floor": (lambda: tunekit.verdict([1, 1.1], [1, 1.1], floor=INF),
                                "floor must be a finite number >= 0 and < 1, got inf"),
    "verdict: a time that is no number": (lambda: tunekit.verdict([1, "x"], [1, 1.1]),
                                          "before must hold at least 2 positive finite times (got [1, 'x'])"),
    "watch_conditions: negative index": (lambda: tunekit.measure.watch_conditions(cuda_index=-1),
                                         "cuda_index must be a whole number >= 0, got -1"),
    "watch_conditions: children a word": (lambda: tunekit.measure.watch_conditions(children="yes"),
                                          "children must be True or False, got 'yes'"),
    "repeat_agreement: no groups": (lambda: tunekit.lab.repeat_agreement([]),
                                    "repeat_agreement needs, for each setting, a list of its RunResults (at least "
                                    "one setting, each with a run), got []"),
    "repeat_agreement: an empty group": (lambda: tunekit.lab.repeat_agreement([[]]), "repeat_agreement needs"),
    "GPTConfig: no layers": (lambda: tunekit.GPTConfig(n_layer=0), "n_layer must be a whole number >= 1, got 0"),
    "GPTConfig: no heads": (lambda: tunekit.GPTConfig(n_head=0), "n_head must be a whole number >= 1, got 0"),
    "GPTConfig: dropout 1": (lambda: tunekit.GPTConfig(dropout=1.0),
                             "dropout must be a finite number >= 0 and < 1, got 1.0"),
    "GPTConfig: fractional vocabulary": (lambda: tunekit.GPTConfig(vocab_size=2.5),
                                         "vocab_size must be a whole number >= 1, got 2.5"),
    "GPTConfig: d_ff 0": (lambda: tunekit.GPTConfig(d_ff=0), "d_ff must be a whole number >= 1, got 0"),
    "GPTConfig: bias a word": (lambda: tunekit.GPTConfig(bias="no"), "bias must be True or False, got 'no'"),
    "measure_memory: micro_batch 0": (lambda: tunekit.measure_memory(_tiny_gpt(), micro_batch=0),
                                      "micro_batch must be a whole number >= 1, got 0"),
    "measure_memory: negative seq_len": (lambda: tunekit.measure_memory(_tiny_gpt(), seq_len=-3),
                                         "seq_len must be a whole number >= 1, got -3"),
    "measure_memory: estimate a word": (lambda: tunekit.measure_memory(_tiny_gpt(), estimate="no"),
                                        "estimate must be True or False, got 'no'"),
}


@pytest.mark.parametrize("call,message", BAD_CALLS.values(), ids=BAD_CALLS.keys())
def test_public_functions_refuse_values_outside_their_meaning(call, message):
    with pytest.raises(ValueError) as info:
        call()
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize("call,said", [
    # case and a dash aside, 'BF16' and 'bf-16' are 'bf16'
    (lambda: tunekit.profile(dtype="BF16"), "got 'BF16': did you mean 'bf16'?"),
    (lambda: tunekit.profile(flops="Never"), "got 'Never': did you mean 'never'?"),
    # difflib: 'layer_norm' is 'layer' at ratio 2 * 5 / 15 = 0.67 >= 0.6, 'rms' far below
    (lambda: tunekit.GPTConfig(norm="layer_norm"), "norm must be one of ('rms', 'layer'), got 'layer_norm': did you "
                                                   "mean 'layer'?"),
    (lambda: tunekit.profile(dtype="int8"), "got 'int8'"),          # close to no dtype: no guess
])
def test_a_choice_spelled_close_to_an_allowed_value_names_it(call, said):
    with pytest.raises(ValueError) as info:
        call()
    assert str(info.value).endswith(said), str(info.value)


def test_count_flops_refuses_what_it_cannot_run():
    with pytest.raises(TypeError, match=r"^fn must be a function to run once under the counter, e\.g\. lambda: "
                                        r"model\(x\)\.sum\(\)\.backward\(\), got int 3$"):
        tunekit.count_flops(3)


@NO_CUDA
@pytest.mark.parametrize("call,given", [
    (lambda: tunekit.calibrate("fp32", device="cuda"), "device='cuda'"),
    (lambda: tunekit.measure.resolve_peak("cuda:0"), "device='cuda:0'"),
    (lambda: tunekit.measure.median_s(lambda: None, device=torch.device("cuda")), "device=device(type='cuda')"),
    (lambda: tunekit.measure.watch_conditions(cuda_index=0), "cuda_index=0"),
    (lambda: tunekit.peak_tflops(torch.device("cuda", 1), "bf16"), "device=device(type='cuda', index=1)"),
])
def test_a_missing_cuda_device_is_a_clear_error_never_an_assertion(call, given):
    with pytest.raises(ValueError) as info:
        call()
    assert str(info.value).startswith(f"{given}: {MISSING}")


@NO_CUDA
def test_peak_of_a_missing_gpu_says_how_to_read_its_spec_sheet_and_the_name_works():
    with pytest.raises(ValueError) as info:
        tunekit.peak_tflops("cuda")
    assert str(info.value) == (f"device='cuda': {MISSING}; to read a device's spec sheet from anywhere, give its "
                               "name: peak_tflops('NVIDIA H100 80GB HBM3')")
    assert tunekit.peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.0
    # planning for a GPU is what an estimate is for: the 0.47 GiB CUDA context line is there
    assert tunekit.estimate_memory(1e6, device="cuda")["cuda_context"] == 0.47 * 2**30


@pytest.mark.parametrize("given, error, message", [
    ("FOLDER", ValueError, "log_path '{tmp}' is a folder, not a run log: give a file in it, "
                           "e.g. log_path='{tmp}/runs.jsonl'"),
    ("", TypeError, "log_path must be the path of a JSONL file (str or pathlib.Path), got ''"),
    (3, TypeError, "log_path must be the path of a JSONL file (str or pathlib.Path), got 3"),
])
def test_a_lab_refuses_a_log_path_that_is_not_a_file(tmp_path, given, error, message):
    # issue 33: an existing folder was taken (a warning, then no runs read or written where asked)
    before = sorted(tmp_path.iterdir())
    with pytest.raises(error) as info:
        Lab(MLP(), batch_fn=batches, loss_fn=mse, log_path=tmp_path if given == "FOLDER" else given)
    assert str(info.value) == message.format(tmp=tmp_path)
    assert sorted(tmp_path.iterdir()) == before   # nothing written
