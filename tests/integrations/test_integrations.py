"""The callbacks with the real trainers: the transformers Trainer and Lightning's Trainer on small
models built from configs (no downloads). Counts, flags and where the figures went; no timing is
compared."""
import json
import math

import pytest
import torch

import tunekit
from tunekit.measure.flops import counting_active

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer needs it


def llama():
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg)


def test_transformers_trainer_figures_reach_every_reporter(tmp_path):
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from tunekit.integrations.transformers import TunekitCallback

    seen = []

    class Reporter(TrainerCallback):  # stands for TensorBoard/MLflow/W&B: listed before ours
        def on_log(self, args, state, control, logs=None, **kw):
            seen.append(dict(logs))

    ids = torch.randint(0, 256, (64, 16))
    data = [{"input_ids": i, "labels": i} for i in ids]
    cb = TunekitCallback(live=False, log_to=f"jsonl:{tmp_path / 'run.jsonl'}")
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=6, per_device_train_batch_size=2,
                             gradient_accumulation_steps=2, logging_steps=2, report_to=[], use_cpu=True,
                             save_strategy="no", disable_tqdm=True)
    trainer = Trainer(model=llama(), args=args, train_dataset=data, callbacks=[Reporter(), cb])
    trainer.train()
    assert trainer.callback_handler.callbacks[0] is cb          # moved to the front (canary)
    rows = cb.monitor.rows
    assert len(rows) == 6 and [r["counted"] for r in rows] == [True] + [False] * 5
    assert [r["warmup"] for r in rows] == [False, True] + [False] * 4
    assert all(r["tokens"] == 2 * 2 * 16 for r in rows)          # 2 micro-batches of 2 x 16 per step
    steps_logged = [log for log in seen if "loss" in log]
    # steps 0 (counted) and 1 (warm-up) have no speed: the first log has none (memory it may have)
    assert len(steps_logged) == 3 and "tunekit/tokens_per_s" not in steps_logged[0]
    for log in steps_logged[1:]:
        assert log["tunekit/tokens_per_s"] > 0 and 0 < log["tunekit/mfu"] and log["tunekit/wall_s"] > 0
    assert cb.monitor.closed and tunekit.last() is cb.monitor.record and not counting_active()
    history = [h for h in trainer.state.log_history if "loss" in h]
    assert len(history) == 3 and all("tunekit/tokens_per_s" in h for h in history[1:])  # trainer_state.json too
    # issue 33: steps numbered as the Trainer numbers them (its global_step once a step ends), each
    # step written whole once (its window's memory in it), warm-up and counted steps marked in JSONL
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [h["step"] for h in history] == [2, 4, 6]                 # logging_steps=2: the same numbers
    lines = [json.loads(x) for x in (tmp_path / "run.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3, 4, 5, 6]
    assert all("tunekit/wall_s" in x and "tunekit/cpu_peak_bytes" in x for x in lines)
    assert [(x["tunekit/counted"], x["tunekit/warmup"]) for x in lines] == [(1, 0), (0, 1)] + [(0, 0)] * 4
    # every figure at every log: the memory peak in each (the speeds where a step was measured)
    assert all(log["tunekit/cpu_peak_bytes"] > 0 for log in steps_logged)
    # one statistic per figure: wall_s is the mean of the window's measured steps, tokens/s their
    # tokens over their time, so tokens/s x wall_s = the tokens of one step (2 x 2 x 16 = 64)
    for log in steps_logged[1:]:
        assert log["tunekit/tokens_per_s"] * log["tunekit/wall_s"] == pytest.approx(64)


def test_the_trainer_traces_the_step_asked_for_and_explain_reads_it(tmp_path):
    from transformers import Trainer, TrainingArguments

    from tunekit.core.breakdown import Breakdown
    from tunekit.integrations.transformers import TunekitCallback

    ids = torch.randint(0, 256, (8, 16))
    cb = TunekitCallback(live=False, trace=2)   # step 0 counted, 1 warm-up, 2 traced, 3 measured
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=4, per_device_train_batch_size=2,
                             logging_steps=2, report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True)
    model = llama()
    Trainer(model=model, args=args, train_dataset=[{"input_ids": i, "labels": i} for i in ids], callbacks=[cb]).train()
    rows, rec = cb.monitor.rows, cb.monitor.record
    assert [r["traced"] for r in rows] == [False, False, True, False]
    assert isinstance(rec.trace, Breakdown) and rec.trace.wall_s == rows[2]["step_s"]
    assert not torch._C._autograd._profiler_enabled()
    e = tunekit.explain(rec, tunekit.plan(model, "cpu", micro_batch=2, seq_len=16))
    assert e.measured_s == rec.trace.wall_s and e.expected_s > 0


def _summary_checked(text: str, name: str) -> None:
    """The summary tunekit shows of a record (core.summary.Summary): its title, the steps with the
    median step time and tokens/s, the speed against the peak it names, the peak memory, the machine."""
    lines = text[text.index(f"⏱ {name}"):].splitlines()
    labels = [line.split()[0] for line in lines[1:6]]
    assert labels == ["time", "FLOPs", "speed", "CPU", "machine"], text
    assert "MFU" in lines[3] and " of " in lines[3] and "peak" in lines[4]
    assert "ms/step median" in text and "tokens/s" in text


def test_the_trainer_shows_the_runs_summary_at_the_end_of_training(tmp_path, capsys):
    from transformers import Trainer, TrainingArguments

    from tunekit.integrations.transformers import TunekitCallback

    ids = torch.randint(0, 256, (8, 16))
    data = [{"input_ids": i, "labels": i} for i in ids]
    for summary in (True, False):
        cb = TunekitCallback(live=False, summary=summary)   # step 0 counted, 1 warm-up, 2 measured
        args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=3, per_device_train_batch_size=2,
                                 logging_steps=3, report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True)
        capsys.readouterr()
        Trainer(model=llama(), args=args, train_dataset=data, callbacks=[cb]).train()
        out = capsys.readouterr().out
        if summary:   # 3 steps (1 warm-up, 1 counted): one measured
            _summary_checked(out, "Trainer LlamaForCausalLM")
            assert "3 steps (1 warm-up, 1 counted)" in out
        else:
            assert "⏱" not in out
    with pytest.raises(ValueError, match="summary must be True or False"):
        TunekitCallback(summary="yes")


def _once(cb, shown) -> None:
    """The run's summary line (the record's first note) is shown once, in the summary (printed here:
    its notes wrapped, hence the words compared), not also as the live view's last line (stderr)."""
    words = " ".join(cb.monitor.record.notes[0].split())
    assert " ".join((shown.err + shown.out).split()).count(words) == 1, shown
    assert shown.err.splitlines()[-1].startswith(f"{cb.monitor.name}: step 3 ·")   # the last step's state


def test_the_trainers_live_view_and_summary_show_the_summary_line_once(tmp_path, capsys):
    from transformers import Trainer, TrainingArguments

    from tunekit.integrations.transformers import TunekitCallback

    ids = torch.randint(0, 256, (8, 16))
    cb = TunekitCallback(live=True)   # no terminal here: the view's lines go to stderr, as a notebook's cell
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=3, per_device_train_batch_size=2,
                             logging_steps=3, report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True)
    data = [{"input_ids": i, "labels": i} for i in ids]
    capsys.readouterr()
    Trainer(model=llama(), args=args, train_dataset=data, callbacks=[cb]).train()
    shown = capsys.readouterr()
    _once(cb, shown)


def test_transformers_callback_refuses_bad_options_when_built():
    from tunekit.integrations.transformers import TunekitCallback, front

    with pytest.raises(ValueError, match="warmup"):
        TunekitCallback(warmup=-1)
    with pytest.raises(ValueError, match="trace must be a whole number >= 0"):
        TunekitCallback(trace=-1)
    with pytest.warns(RuntimeWarning, match="callback list"):
        assert front(object(), None) is False


def test_a_failed_cell_ends_the_step_going(ip):
    model = torch.nn.Linear(4, 4)
    mon = tunekit.Monitor(model, live=False)      # in IPython it watches the cells
    mon.start_step()
    model(torch.randn(2, 4))                # the first forward starts the FLOP counter
    assert counting_active()
    ip.run_cell("raise ValueError('in the loop')")
    assert not counting_active() and mon._open is None
    assert mon.rows[0]["error"].startswith("ValueError")
    mon.close()


lightning = pytest.importorskip("lightning")


class _Module(lightning.LightningModule):
    def __init__(self, fail_at=None):
        super().__init__()
        torch.manual_seed(0)
        self.model = tunekit.GPT(tunekit.GPTConfig.preset("cpu-tiny"))   # called as self.model
        self.fail_at = fail_at

    def training_step(self, batch, i):
        if i == self.fail_at:
            raise RuntimeError("step failed")
        x, y = batch
        return self.model(x, y)[1]

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def _fit(tmp_path, module, steps=6, accumulate=1, trace=None, live=False):
    from lightning.pytorch.loggers import CSVLogger

    from tunekit.integrations.lightning import TunekitCallback

    data = [tuple(torch.randint(0, 256, (2, 2, 32))) for _ in range(steps * accumulate)]
    cb = TunekitCallback(live=live, log_every=2, trace=trace)
    trainer = lightning.Trainer(max_steps=steps, callbacks=[cb], logger=CSVLogger(str(tmp_path)),
                                accumulate_grad_batches=accumulate, enable_progress_bar=False,
                                enable_model_summary=False, enable_checkpointing=False, accelerator="cpu")
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=None))
    return cb, trainer


def test_lightning_steps_and_loggers(tmp_path):
    cb, trainer = _fit(tmp_path, _Module(), steps=4, accumulate=2, trace=3)
    rows = cb.monitor.rows
    assert len(rows) == 4 and rows[0]["counted"] and not any(r["counted"] for r in rows[1:])
    assert [r["traced"] for r in rows] == [False, False, False, True]   # both micro-batches of step 3
    assert cb.monitor.record.trace.wall_s == rows[3]["step_s"] and not torch._C._autograd._profiler_enabled()
    assert [r["step"] for r in rows] == [1, 2, 3, 4]     # trainer.global_step once each step ended
    assert all(r["tokens"] == 2 * 2 * 32 for r in rows)           # 2 micro-batches of 2 x 32
    assert all(isinstance(r["loss"], float) and not math.isnan(r["loss"]) for r in rows)
    csv = (tmp_path / "lightning_logs" / "version_0" / "metrics.csv").read_text()
    assert "tunekit/tokens_per_s" in csv.splitlines()[0] and "tunekit/mfu" in csv.splitlines()[0]
    assert cb.monitor.closed and not cb.monitor.model._forward_pre_hooks


def test_lightning_exception_ends_the_step_and_closes(tmp_path):
    with pytest.raises(RuntimeError, match="step failed"):
        _fit(tmp_path, _Module(fail_at=0), steps=3)
    assert not counting_active()
    assert tunekit.last().error.startswith("RuntimeError: step failed")


def test_lightning_shows_the_fits_summary_at_the_end_of_training(tmp_path, capsys):
    capsys.readouterr()
    _fit(tmp_path, _Module(), steps=3)   # step 0 counted, 1 warm-up, 2 measured
    out = capsys.readouterr().out
    _summary_checked(out, "Lightning _Module")
    assert "3 steps (1 warm-up, 1 counted)" in out


def test_lightnings_live_view_and_summary_show_the_summary_line_once(tmp_path, capsys):
    capsys.readouterr()
    cb, _ = _fit(tmp_path, _Module(), steps=3, live=True)
    shown = capsys.readouterr()
    _once(cb, shown)
