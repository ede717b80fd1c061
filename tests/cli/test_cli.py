"""The `tunekit` command: every toggle an option with its default, a real run on cpu-tiny that
writes the log and the report, bad options refused before any work (exit 2), a failed run
exit 1, and the argument plumbing of the distributed paths (the engine itself faked here)."""
import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import types

import pytest

from tunekit.cli import main as cli
from tunekit.cli.options import DeviceRule
from tunekit.cli.options import flag as option_flag
from tunekit.core.results import RunResult
from tunekit.core.toggles import Toggles
from tunekit.lab.runlog import read_records

TORCHRUN = {"TORCHELASTIC_RUN_ID": "job", "RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "2"}


def _help_of(text: str, flag: str) -> str:
    """The help entry of one option: from its flag to the next option line."""
    m = re.search(rf"^  {re.escape(flag)}\b.*?(?=^  --|^\S|\Z)", text, re.S | re.M)
    assert m, f"{flag} not in the help"
    return " ".join(m.group(0).split())


def test_help_lists_every_toggle_with_its_default():
    out = subprocess.run([sys.executable, "-m", "tunekit", "run", "--help"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for f in dataclasses.fields(Toggles):
        entry = _help_of(out.stdout, option_flag(f.name))
        # a default that is a rule of the device (the precision: core.setting.best_precision) says the rule
        assert f"(default: {DeviceRule() if f.metadata.get('device_default') else f.default})" in entry, entry
    for flag, default in (("--steps", 20), ("--warmup", 2), ("--model", "cpu-tiny"), ("--parallel", "none"),
                          ("--nproc", None), ("--nodes", None), ("--link-bandwidth", None),
                          ("--link-latency", None), ("--log", "tunekit-runs.jsonl"),
                          ("--report", "tunekit-report.html")):
        assert f"(default: {default})" in _help_of(out.stdout, flag).replace("- ", "-")
    assert "--log-path" in _help_of(out.stdout, "--log")   # the name torchrun's parser lets through
    assert "{fp32,tf32,bf16,fp16}" in out.stdout and "{none,ddp,fsdp,fsdp_grad_op,hsdp}" in out.stdout


def test_top_level_help_lists_the_commands_one_line_each(capsys):
    # `tunekit --help` printed the whole of `tunekit run --help` under the command list
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    sub = next(a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == ["run", "plan", "diff", "doctor"]
    for name in sub.choices:   # a new command needs its one line of help
        assert len(re.findall(rf"^    {name}\s+\S.*$", out, re.M)) == 1, name
    assert "--micro-batch" not in out and "--precision" not in out    # run's options: `tunekit run --help`
    assert len(out.splitlines()) < 20, out


def test_a_new_toggle_becomes_an_option(monkeypatch):
    @dataclasses.dataclass(frozen=True)
    class More(Toggles):
        fused_loss: bool = False
        dropout: float = 0.0

    monkeypatch.setattr(cli.tg, "Toggles", More)
    args = cli.run_parser().parse_args(["--fused-loss", "--dropout", "0.1"])
    assert args.fused_loss is True and args.dropout == 0.1 and args.micro_batch == 8


@pytest.mark.slow
def test_run_on_cpu_tiny_writes_a_log_line_and_a_report(tmp_path):
    log, report = tmp_path / "runs.jsonl", tmp_path / "out" / "report.html"
    cmd = [sys.executable, "-m", "tunekit", "run", "--steps", "2", "--warmup", "0", "--micro-batch", "2",
           "--seq-len", "16", "--log", str(log), "--report", str(report)]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    records, skipped = read_records(log)
    assert skipped == 0 and len(records) == 1
    rec = records[0]
    # 2 samples x 16 tokens = 32 tokens per step
    assert (rec["steps"], rec["micro_batch"], rec["seq_len"], rec["tokens_per_step"]) == (2, 2, 16, 32)
    assert rec["status"] == "ok" and rec["tokens_per_s"] > 0
    assert "tokens/s" in out.stdout and f"run #{rec['run_id']}" in out.stdout and str(log) in out.stdout
    page = report.read_text()
    assert page.count("Plotly.newPlot(") == 1 and "mb=2 T=16" in page
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=['\"]?https?:", page)   # self-contained


def test_run_with_trace_prints_the_traced_line_and_logs_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TUNEKIT_DATA_DIR", str(tmp_path / "data"))   # the Chrome trace
    log = tmp_path / "runs.jsonl"
    assert cli.main(["run", "--steps", "2", "--warmup", "1", "--micro-batch", "2", "--seq-len", "16", "--trace",
                     "--log", str(log), "--report", str(tmp_path / "r.html")]) == 0
    out = capsys.readouterr().out.splitlines()
    traced = [line for line in out if line.split()[:1] == ["traced"]]
    rec = read_records(log)[0][0]
    # the run's step against its plan, in one line, printed and logged
    assert len(traced) == 1 and "per step" in traced[0] and "of the expected speed" in traced[0], out
    assert rec["explained"] and rec["explained"] in traced[0]


def _refused(argv, capsys, monkeypatch, env=None):
    for k in TORCHRUN:
        monkeypatch.delenv(k, raising=False)
    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr("tunekit.lab.lab.Lab", None)   # constructing a Lab would be work: fails loudly
    with pytest.raises(SystemExit) as e:
        code = cli.main(["run", *argv])
        raise SystemExit(code)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "error" in err, err
    return err


def test_a_run_too_big_for_the_machine_names_the_search_as_a_shell_user_runs_it(tmp_path, capsys, monkeypatch):
    for k in TORCHRUN:
        monkeypatch.delenv(k, raising=False)
    # refused by the cheap line, before any step
    assert cli.main(["run", "--micro-batch", "100000", "--log", str(tmp_path / "l.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "does not fit" in err and "lab.find_max_batch_size()" not in err
    assert "python -c \"from tunekit import Lab; Lab(preset='cpu-tiny').find_max_batch_size()\"" in err


@pytest.mark.parametrize("argv,match", [
    (["--micro-batch", "0"], "micro_batch must be a whole number >= 1"),
    (["--micro-batch", "two"], "invalid int value"),
    (["--precision", "fp8"], "invalid choice"),
    (["--precision", "fp16"], "fp16 training is refused on CPU"),
    (["--lr", "0"], "lr must be a finite number > 0"),
    (["--steps", "0"], "--steps must be >= 1"),
    (["--warmup", "-1"], "--warmup must be >= 0"),
    (["--model", "no-such-model"], "is not a preset"),
    (["--model", "cpu-tiyn"], "--model 'cpu-tiyn' is not a preset: did you mean 'cpu-tiny'? (the presets:"),
    (["--model", "missing.json"], "not a readable JSON file"),
    (["--nproc", "2"], "give --parallel too"),
    (["--parallel", "hsdp", "--nproc", "2"], "needs --nodes >= 2"),
    (["--parallel", "ddp", "--nproc", "0"], "--nproc must be >= 1"),
    (["--parallel", "fsdp", "--nodes", "2", "--link-bandwidth", "50mbps"], "bandwidth"),
    (["--parallel", "fsdp", "--nodes", "2", "--link-latency", "soon"], "latency"),
    (["--parallel", "fsdp", "--link-bandwidth", "50mbit"], "need --nodes >= 2"),
    (["--log", "/proc/no/such/log.jsonl"], "cannot be written"),
    (["--no-such-option"], "unrecognized arguments"),
    (["--trace", "--parallel", "ddp", "--nproc", "2"], "--trace traces one process's step"),
    # a job's options without the job: once ran locally, the options ignored in silence
    (["--gpus-per-node", "8"], "--gpus-per-node acts only with --slurm: give --slurm too, or leave it out"),
    (["--time", "2:00:00", "--qos", "high"],
     "--time, --qos act only with --slurm: give --slurm too, or leave them out"),
])
def test_bad_options_one_line_exit_2_before_any_work(argv, match, capsys, monkeypatch):
    assert match in _refused(argv, capsys, monkeypatch)


def test_plan_names_only_the_models_it_takes_and_never_imports_a_factory(capsys, monkeypatch):
    # it once offered 'package.module:function' and refused it when given, after importing it;
    # 'gpt2' begins 'gpt2-124m' and 'gpt2-350m': the first of the presets is meant (difflib took the last)
    monkeypatch.setattr("tunekit.cli.model.check_factory", None)   # importing it would be work: fails loudly
    assert cli.main(["plan", "--model", "gpt2"]) == 2
    assert capsys.readouterr().err.strip() == (
        "tunekit plan: error: --model 'gpt2' is not a preset: did you mean 'gpt2-124m'? (the presets: cpu-tiny, "
        "cpu-small, gpt2-124m, gpt2-350m, gpt-1b), a config .json file")
    assert cli.main(["plan", "--model", "mymodels:tiny_lm"]) == 2
    assert capsys.readouterr().err.strip() == (
        "tunekit plan: error: --model mymodels:tiny_lm: tunekit plan builds the model from a config: a GPT preset "
        "or a transformers config JSON, not a factory ('package.module:function')")


@pytest.mark.parametrize("argv, said", [
    (["--option", "2"], "tunekit plan: error: --option acts only with --sbatch: give --sbatch too, or leave it out"),
    (["--partition", "gpu", "--time", "1:00:00"],
     "tunekit plan: error: --partition, --time act only with --sbatch: give --sbatch too, or leave them out"),
])
def test_plan_refuses_a_batch_scripts_options_without_sbatch(argv, said, capsys, monkeypatch):
    # they once printed the plan and ignored the options in silence; refused before any planning
    monkeypatch.setattr("tunekit.planning.planner.plan", None)   # planning would be work: fails loudly
    assert cli.main(["plan", *argv]) == 2
    assert capsys.readouterr().err.strip() == said


@pytest.mark.parametrize("argv, said", [
    (["run", "--stps", "3"], "tunekit run: error: unrecognized arguments: --stps 3: did you mean --steps? "
                             "(see tunekit run --help)"),
    (["plan", "--modle", "gpt2-124m"], "tunekit plan: error: unrecognized arguments: --modle gpt2-124m: did you "
                                       "mean --model? (see tunekit plan --help)"),
    (["plan", "--micro-batch=2", "extra"], "tunekit plan: error: unrecognized arguments: extra "
                                           "(see tunekit plan --help)"),
    (["doctr"], "tunekit: error: argument COMMAND: invalid choice: 'doctr' (choose from 'run', 'plan', 'diff', "
                "'doctor'): did you mean 'doctor'? (see tunekit --help)"),
    # a name of the Python API is said as such: 'explain' was answered "did you mean 'plan'?"
    (["explain"], "tunekit: error: argument COMMAND: invalid choice: 'explain' (choose from 'run', 'plan', 'diff', "
                  "'doctor'): 'explain' is tunekit.explain() in Python, not a command (from a shell: tunekit run "
                  "--trace) (see tunekit --help)"),
    (["profile"], "tunekit: error: argument COMMAND: invalid choice: 'profile' (choose from 'run', 'plan', 'diff', "
                  "'doctor'): 'profile' is tunekit.profile() in Python, not a command (see tunekit --help)"),
    # a dtype's other name is the precision meant (difflib found 'bf16' for 'bfloat16', nothing for these)
    (["plan", "--precision", "half"], "tunekit plan: error: argument --precision: invalid choice: 'half' (choose "
                                      "from 'fp32', 'tf32', 'bf16', 'fp16'): did you mean 'fp16'? (see tunekit plan "
                                      "--help)"),
    (["run", "--precision", "float32"], "tunekit run: error: argument --precision: invalid choice: 'float32' (choose "
                                        "from 'fp32', 'tf32', 'bf16', 'fp16'): did you mean 'fp32'? (see tunekit run "
                                        "--help)"),
])
def test_a_misspelled_option_or_command_is_named_by_its_command_with_the_nearest(argv, said, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2 and capsys.readouterr().err.strip() == said


def test_a_link_this_machine_cannot_emulate_refused(capsys, monkeypatch):
    monkeypatch.setattr("tunekit.parallel.netns.check", lambda: "emulated nodes need root")
    err = _refused(["--parallel", "fsdp", "--nodes", "2", "--link-bandwidth", "50mbit"], capsys, monkeypatch)
    assert err.endswith("--link-* cannot emulate nodes here: emulated nodes need root")


def test_transformers_config_without_model_type_refused(tmp_path, capsys, monkeypatch):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"hidden_size": 64}))
    assert "model_type" in _refused(["--model", str(cfg)], capsys, monkeypatch)


@pytest.mark.parametrize("argv,match", [([], "--parallel"), (["--parallel", "ddp", "--nproc", "4"], "does not match"),
                                        (["--parallel", "fsdp", "--link-bandwidth", "1gbit"], "real")])
def test_under_torchrun_the_job_layout_rules(argv, match, capsys, monkeypatch):
    assert match in _refused(argv, capsys, monkeypatch, env=TORCHRUN)


def _result(**kw) -> RunResult:
    return RunResult.from_dict({"label": "fake", "steps": 2, "warmup": 0, "tokens_per_step": 32,
                                "tokens_per_s": 1000.0, "step_s": 0.032, "model": "GPT", "device": "cpu",
                                "notes": [], "params_bytes": 1, "grads_bytes": 1, "optimizer_bytes": 2,
                                "peak_tflops_source": "given", "peak_mem_source": "rss", **kw})


@pytest.mark.parametrize("rank", ["0", "1"])
def test_under_torchrun_it_joins_the_job_and_only_rank_0_writes(rank, tmp_path, capsys, monkeypatch):
    for k, v in {**TORCHRUN, "RANK": rank}.items():
        monkeypatch.setenv(k, v)
    specs = []

    def join(spec):
        specs.append(spec)
        if rank != "0":
            return None
        r = _result()
        r.world_size, r.parallel, r.nodes = 4, "hsdp", 2   # the distributed engine's fields
        return r

    monkeypatch.setitem(sys.modules, "tunekit.parallel.worker", types.SimpleNamespace(join=join))
    monkeypatch.setattr("tunekit.lab.lab.Lab", None)   # joining never builds an in-process Lab
    log, report = tmp_path / "log.jsonl", tmp_path / "r.html"
    code = cli.main(["run", "--parallel", "hsdp", "--micro-batch", "2", "--steps", "3", "--model", "cpu-small",
                     "--log", str(log), "--report", str(report)])
    out = capsys.readouterr().out
    assert code == 0 and len(specs) == 1
    spec = specs[0]
    # 4 ranks, LOCAL_WORLD_SIZE 2: 2 nodes x 2 ranks per node
    assert (spec["parallel"], spec["nproc"], spec["nodes"], spec["steps"], spec["warmup"]) == ("hsdp", 2, 2, 3, 2)
    assert spec["toggles"] == {"micro_batch": 2}
    assert spec["model"]["kind"] == "gpt" and spec["model"]["config"]["n_layer"] == 4   # cpu-small
    if rank == "0":
        assert len(read_records(log)[0]) == 1 and report.is_file() and "hsdp · 4 ranks · 2 nodes" in out
    else:
        assert out == "" and not report.exists() and read_records(log)[0] == []


class FakeLab:
    calls = []

    def __init__(self, model=None, preset="cpu-tiny", log_path=None, **kw):
        self.log = __import__("tunekit.lab.runlog", fromlist=["RunLog"]).RunLog(log_path)
        FakeLab.calls.append(("init", model, preset))

    def run(self, **kw):
        FakeLab.calls.append(("run", kw))
        if kw.get("lr") == 0.5:
            raise RuntimeError("rank 1 failed:\nTraceback (most recent call last):\n  File ...\nValueError: bad")
        return self.log.add(_result())


def test_parallel_options_reach_lab_run(tmp_path, monkeypatch, capsys):
    for k in TORCHRUN:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr("tunekit.lab.lab.Lab", FakeLab)
    monkeypatch.setattr("tunekit.parallel.netns.check", lambda: None)   # as if root: the Lab is fake anyway
    FakeLab.calls = []
    code = cli.main(["run", "--parallel", "fsdp", "--nproc", "2", "--nodes", "2", "--link-bandwidth", "50mbit",
                     "--precision", "bf16", "--checkpointing", "--log", str(tmp_path / "l.jsonl"),
                     "--report", str(tmp_path / "r.html")])
    assert code == 0, capsys.readouterr().err
    (_, model, preset), (_, kw) = FakeLab.calls
    assert model is None and preset == "cpu-tiny"
    assert {k: kw[k] for k in ("parallel", "nproc", "nodes", "link", "precision", "checkpointing", "steps")} == {
        "parallel": "fsdp", "nproc": 2, "nodes": 2, "link": {"bandwidth": "50mbit", "latency": "1ms"},
        "precision": "bf16", "checkpointing": True, "steps": 20}


def test_without_parallel_no_distributed_arguments(tmp_path, monkeypatch):
    for k in TORCHRUN:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr("tunekit.lab.lab.Lab", FakeLab)
    FakeLab.calls = []
    assert cli.main(["run", "--log", str(tmp_path / "l.jsonl"), "--report", str(tmp_path / "r.html")]) == 0
    kw = FakeLab.calls[1][1]
    assert set(kw) == {"steps", "warmup", "progress", "verbose"}   # all toggles at their defaults: none passed


def test_a_failed_run_exits_1_with_one_line(tmp_path, monkeypatch, capsys):
    for k in TORCHRUN:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr("tunekit.lab.lab.Lab", FakeLab)
    code = cli.main(["run", "--lr", "0.5", "--log", str(tmp_path / "l.jsonl"), "--report", str(tmp_path / "r.html")])
    err = capsys.readouterr().err.strip()
    assert code == 1 and err == "tunekit run: failed: RuntimeError: rank 1 failed: ... ValueError: bad"


def test_the_seconds_before_a_run_s_first_step_or_a_plan_show_what_they_wait_for(tmp_path, monkeypatch, capsys):
    # importing torch (and transformers) and building the model took 7-15 s with nothing shown on a
    # busy 2-core machine; a wait shows from 2 s on (a terminal: redrawn; elsewhere its end line only)
    for k in TORCHRUN:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr("tunekit.view.progress.SHOW_AFTER_S", 0.0)   # as if the wait were long
    monkeypatch.setattr("tunekit.lab.lab.Lab", FakeLab)
    assert cli.main(["run", "--log", str(tmp_path / "l.jsonl"), "--report", str(tmp_path / "r.html")]) == 0
    assert re.fullmatch(r"tunekit run: setting up: done in \d+\.\d s", capsys.readouterr().err.strip())
    stages = []
    monkeypatch.setattr("tunekit.view.progress.WaitProgress.at", lambda self, stage, f=None: stages.append(stage))
    monkeypatch.setattr("tunekit.planning.planner.plan", lambda *a, **k: type("P", (), {"fits": True})())
    assert cli.main(["plan", "--model", "cpu-tiny"]) == 0
    assert stages == ["importing torch"]   # a preset: transformers is not imported


@pytest.mark.parametrize("parallel", ["none", "ddp"])
def test_a_factory_model_is_built_here_or_sent_as_its_name(parallel, tmp_path, monkeypatch):
    for k in TORCHRUN:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr("tunekit.lab.lab.Lab", FakeLab)
    FakeLab.calls = []
    argv = ["run", "--model", "collections:OrderedDict", "--parallel", parallel,
            "--log", str(tmp_path / "l.jsonl"), "--report", str(tmp_path / "r.html")]
    assert cli.main(argv) == 0
    model = FakeLab.calls[0][1]
    # one process: the factory's model itself; ranks: the name, so that each builds its own
    assert model == "collections:OrderedDict" if parallel == "ddp" else type(model).__name__ == "OrderedDict"


def test_version_names_tunekit_torch_and_python():
    from importlib.metadata import version
    from platform import python_version

    import tunekit

    out = subprocess.run([sys.executable, "-m", "tunekit", "--version"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"tunekit {tunekit.__version__} (torch {version('torch')}, Python {python_version()})\n"


def _outside_sys_path(tmp_path, monkeypatch):
    # what the `tunekit` console script sees: its own bin/ folder first, not the current directory
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    for k in TORCHRUN:
        monkeypatch.delenv(k, raising=False)


def test_a_factory_in_the_current_directory_is_found(tmp_path, monkeypatch):
    (tmp_path / "tk_cwd_models.py").write_text("import collections\ndef build():\n    return collections.Counter()\n")
    _outside_sys_path(tmp_path, monkeypatch)
    monkeypatch.setattr("tunekit.lab.lab.Lab", FakeLab)
    FakeLab.calls = []
    assert cli.main(["run", "--model", "tk_cwd_models:build", "--log", "l.jsonl", "--report", "r.html"]) == 0
    assert type(FakeLab.calls[0][1]).__name__ == "Counter" and sys.path[0] == str(tmp_path)


def test_a_factory_s_model_that_takes_no_token_batches_is_sent_to_python(tmp_path, monkeypatch, capsys):
    # a CNN: the Lab's advice ("make batch_fn return ...") names arguments no option of tunekit run gives
    (tmp_path / "tk_cnn.py").write_text("import torch\ndef build():\n    return torch.nn.Conv2d(3, 4, 3)\n")
    _outside_sys_path(tmp_path, monkeypatch)
    monkeypatch.setattr("tunekit.view.progress.SHOW_AFTER_S", 1e9)   # a busy machine's set-up line: not this test's
    assert cli.main(["run", "--model", "tk_cnn:build", "--steps", "1", "--log", "l.jsonl", "--report", "r.html"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("tunekit run: failed: ValueError: ") and len(err.splitlines()) == 1, err
    assert err.endswith("; tunekit run gives a factory's model the Lab's byte-token batches (x, y: micro-batch x "
                        "seq-len int64) and takes the loss from model(x, y); a model that takes other inputs runs "
                        "from Python: tunekit.Lab(model, batch_fn, loss_fn) (the docs: Your own model)")


@pytest.mark.parametrize("source,model,match", [
    (None, "tk_no_such_module:build", "no module 'tk_no_such_module' on sys.path ({path}); run from the "
                                      "folder that holds it or add that folder to PYTHONPATH"),
    ("import tk_missing_dependency\n", "tk_needs_dep:build",
     "importing 'tk_needs_dep' failed (ModuleNotFoundError: No module named 'tk_missing_dependency')"),
    ("x = 1\n", "tk_no_fn:build", "module 'tk_no_fn' has no 'build'"),
    ("build = 3\n", "tk_not_callable:build", "'build' in 'tk_not_callable' is not callable"),
])
def test_a_factory_that_cannot_be_imported_is_refused_naming_sys_path(source, model, match, tmp_path,
                                                                       capsys, monkeypatch):
    if source is not None:
        (tmp_path / f"{model.split(':')[0]}.py").write_text(source)
    _outside_sys_path(tmp_path, monkeypatch)
    err = _refused(["--model", model], capsys, monkeypatch)
    assert err == f"tunekit run: error: --model {model}: " + match.format(path=os.pathsep.join(sys.path))
    assert sys.path[0] == str(tmp_path)  # the current directory was searched


def test_runs_report_is_built_from_run_results_alone(tmp_path):
    from tunekit.cli.report_html import runs_report

    ok = _result(run_id=0, peak_tflops=0.5, notes=["a <note>"])
    bad = RunResult.failed(Toggles(micro_batch=64), "mb=64", "out of <memory>", [], run_id=1)
    page = runs_report([ok, bad], tmp_path / "sub" / "r.html", title="two runs").read_text()
    assert page.count("Plotly.newPlot(") == 1 and "<h1>two runs</h1>" in page
    assert "#1 mb=64 (failed)" in page and "out of &lt;memory&gt;" in page and "a &lt;note&gt;" in page
    assert "0.5 TFLOPS: given" in page and "micro_batch=64" in page
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=['\"]?https?:", page)


def test_plan_with_a_transformers_config_without_the_extra_names_the_pip_command(tmp_path, monkeypatch, capsys):
    # issue 33: without transformers this printed only "No module named 'transformers'"
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                               "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 256}))
    monkeypatch.setitem(sys.modules, "transformers", None)   # an import of it fails as if not installed
    stages = []   # from a wheel: "tunekit plan stopped after 2.6 s, at importing torch and transformers" came first
    monkeypatch.setattr("tunekit.view.progress.WaitProgress.at", lambda self, stage, f=None: stages.append(stage))
    assert cli.main(["plan", "--model", str(cfg)]) == 2
    assert capsys.readouterr().err.strip() == (
        "tunekit plan: error: --model with a transformers config JSON needs transformers, which is not "
        "installed: pip install 'tunekit[hf]'")
    assert stages == []   # refused before the wait began: nothing imported


def test_every_optional_package_names_its_extra_from_pyproject():
    import tomllib

    from tunekit.core.extras import EXTRAS, missing_extra, pip_command

    extras = tomllib.loads(open(os.path.join(os.path.dirname(__file__), "..", "..", "pyproject.toml")).read())
    declared = extras["project"]["optional-dependencies"]
    for package, extra in EXTRAS.items():   # each names an extra that exists and lists a package of that name
        assert any(re.match(package.replace("_", "[-_]"), d) for d in declared[extra]) or package in (
            "pytorch_lightning",), (package, extra)
    assert pip_command("transformers.models") == "pip install 'tunekit[hf]'" and pip_command("numpy") is None
    # the experiments extra's own command: without the deprecated pynvml (its shim makes `import torch` warn)
    assert pip_command("ipyexperiments") == "pip install --no-deps 'ipyexperiments>=0.1.29'"
    assert pip_command("ipyexperiments").endswith(f"'{declared['experiments'][0]}'")   # pyproject's pin
    assert missing_extra(ModuleNotFoundError("x", name="numpy"), "y") is None      # not an extra's: re-raised as is
    assert missing_extra(ImportError("x", name="transformers"), "y") is None       # installed but broken: as is


def test_the_trainer_callback_without_transformers_names_the_pip_command(monkeypatch):
    import importlib

    monkeypatch.setitem(sys.modules, "transformers", None)
    monkeypatch.delitem(sys.modules, "tunekit.integrations.transformers", raising=False)
    with pytest.raises(ModuleNotFoundError, match=r"^tunekit.integrations.transformers needs transformers, which is "
                                                  r"not installed: pip install 'tunekit\[hf\]'$"):
        importlib.import_module("tunekit.integrations.transformers")


def test_the_lightning_callback_without_lightning_says_it_as_every_missing_extra(monkeypatch):
    import importlib

    # it said "needs Lightning: pip install ..." in words of its own; the Monitor's sinks said "cannot be imported"
    for name in ("lightning", "lightning.pytorch", "lightning.pytorch.callbacks", "pytorch_lightning",
                 "pytorch_lightning.callbacks"):
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "tunekit.integrations.lightning", raising=False)
    with pytest.raises(ModuleNotFoundError, match=r"^tunekit.integrations.lightning needs lightning, which is "
                                                  r"not installed: pip install 'tunekit\[lightning\]'$"):
        importlib.import_module("tunekit.integrations.lightning")


@pytest.mark.parametrize("scheme, module", [("tensorboard", "tensorboard"), ("mlflow", "mlflow")])
def test_a_monitor_sink_without_its_package_says_it_as_every_missing_extra(monkeypatch, tmp_path, scheme, module):
    import torch

    import tunekit

    monkeypatch.setitem(sys.modules, module, None)
    target = f"{scheme}:{tmp_path / 'logs'}"
    with pytest.raises(ModuleNotFoundError, match=rf"^log_to '{re.escape(target)}' needs {module}, which is not "
                                                  rf"installed: pip install 'tunekit\[{scheme}\]'$"):
        tunekit.Monitor(torch.nn.Linear(4, 4), log_to=target)


@pytest.mark.parametrize("command", ["run", "plan", "diff", "doctor"])
def test_no_option_states_its_default_twice(command, capsys):
    # `tunekit plan --help` printed "--partition ... (default: the cluster's) (default: None)"
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())     # argparse wraps lines: one line of words
    assert not re.search(r"\(default: [^()]*\) \(default: ", text), text


@pytest.mark.parametrize("argv", [["--help"], ["plan", "--help"], ["run", "--help"]])
def test_help_answers_without_importing_torch(argv):
    # torch takes 1-2 s to import on a quiet 2-core machine (13 s on a busy one): help needs none of it
    code = ("import sys\nfrom tunekit.cli.main import main\ntry:\n    main(%r)\nexcept SystemExit:\n    pass\n"
            "print('torch imported' if 'torch' in sys.modules else 'no torch')" % argv)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "no torch" and "usage: tunekit" in out



@pytest.mark.parametrize("device, said", [
    ("A6000", "unknown device 'A6000': did you mean 'A100 80GB'? (the devices: {names}, or 'cpu')"),
    # a memory size the card lacks (tests/planning/test_plan_review.py): read as the A100 80GB, which has 80
    ("A100 40", "'A100 40' names 40 GB, but the spec table's A100 80GB has 80 GB: did you mean 'A100 40GB'? "
                "(else plan for 'A100 80GB' and set its total_bytes against your card's memory, or pick a device "
                "of the table)"),
])
def test_plan_refuses_a_card_the_table_lacks_before_importing_torch(device, said):
    # from a wheel on a busy machine `tunekit plan --device A6000` took 5.1 s and ended "tunekit plan
    # stopped after 5.1 s, at importing torch: ValueError" above the refusal: the card is checked first
    from tunekit.core.specs import names  # the table's cards (H100 NVL, ..., MI300X): core/gpus.py's rows

    code = ("import sys\nfrom tunekit.cli.main import main\ncode = main(['plan', '--device', %r])\n"
            "print(code, 'torch imported' if 'torch' in sys.modules else 'no torch')" % device)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["2 no torch"]
    assert out.stderr.splitlines() == ["tunekit plan: error: " + said.format(names=", ".join(names()))]
