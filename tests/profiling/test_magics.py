"""The magics in a real IPython InteractiveShell."""

import pytest
from IPython.core.error import UsageError

import tunekit

# `ip` (a real InteractiveShell with the extension loaded) and `run` come from conftest.py

STEP = "%%gpuprofile -q -n step\nx = torch.randn(batch_size, 128)\nmodel(x).sum().backward()"


def test_train_step_flops_double_when_batch_size_changes_in_another_cell(run):
    # forward 2 + weight-grad 2 FLOPs per weight per row (x needs no grad): 4*128*128*8 = 524288
    run(STEP)
    run(STEP)
    a, b = tunekit.history().iloc[-2:].to_dict("records")
    assert (a["flops"], a["flops_source"]) == (524288, "counted")
    assert (b["flops"], b["flops_source"]) == (524288, "cached") and b["tflops"] > 0
    run("batch_size = 16")
    run(STEP)
    c = tunekit.last()
    assert (c.flops, c.flops_source) == (2 * 524288, "counted")


def test_cell_value_is_returned_and_summary_displayed(run, capsys):
    r = run("%%gpuprofile -n answer\n6 * 7")
    assert r.result == 42
    out = capsys.readouterr().out
    assert "answer" in out and "time" in out and "CPU RAM" in out


def test_quiet_records_without_displaying(run, capsys):
    run("%%gpuprofile -q -n silent\n1 + 1")
    assert "silent" not in capsys.readouterr().out
    assert tunekit.last().name == "silent"


def test_error_is_recorded_and_reaches_the_user(run):
    r = run("%%gpuprofile -q -n fails\nraise ValueError('boom')")
    assert isinstance(r.error_in_exec, ValueError) and str(r.error_in_exec) == "boom"
    assert tunekit.last().error == "ValueError: boom"


def test_bad_arguments_are_usage_errors(run):
    for bad in ("--flops sometimes", "--dtype int3", "--peak -1", "--model-flops -5", "on",
                "--flops always --trace", "--memory --flops always"):
        r = run(f"%%gpuprofile {bad}\n1")
        assert isinstance(r.error_in_exec, UsageError), bad
    r = run("%gpuprofile")
    assert isinstance(r.error_in_exec, UsageError)


@pytest.mark.parametrize("line", ["%%gpuprofile --help", "%%gpuprofile -h", "%%gpuprofile -n x --help",
                                  "%gpuprofile --help", "%gpuprofile on -h"])
def test_help_prints_the_usage_and_runs_nothing(run, capsys, line):
    # once "UsageError: unrecognized arguments: --help"; `%%gpuprofile?` showed it
    n0 = len(tunekit.history())
    r = run(f"{line}\nran = 1" if line.startswith("%%") else line)
    out = capsys.readouterr().out
    assert r.error_in_exec is None and r.result is None
    assert out.startswith("  %gpuprofile [-n NAME] [-q] [--flops {auto,always,never}]")
    assert "\nProfile a cell: time, CPU/GPU memory, FLOPs, TFLOPS, MFU/HFU." in out and "--steps STEPS" in out
    assert len(tunekit.history()) == n0 and run("ran").error_in_exec is not None   # nothing ran, nothing recorded


def test_on_profiles_every_cell_including_failures_and_off_stops(run):
    n0 = len(tunekit.history())
    run("%gpuprofile on -q")
    run("y = sum(range(10))")
    run("1/0")
    run("%gpuprofile off")
    run("z = 2")
    df = tunekit.history().iloc[n0:]
    assert len(df) == 2
    assert df.iloc[1]["error"] == "ZeroDivisionError: division by zero"
    assert df.iloc[0]["flops"] == 0 and df.iloc[0]["tflops"] == 0.0


def test_load_twice_registers_once_and_unload_removes_everything(ip, run):
    ip.run_line_magic("load_ext", "tunekit")
    run("%gpuprofile on -q")
    hooks = len(ip.events.callbacks["pre_run_cell"]), len(ip.events.callbacks["post_run_cell"])
    ip.run_line_magic("unload_ext", "tunekit")
    assert "gpuprofile" not in ip.magics_manager.magics["cell"]
    assert "gpuprofile" not in ip.magics_manager.magics["line"]
    assert len(ip.events.callbacks["pre_run_cell"]) == hooks[0] - 1
    assert len(ip.events.callbacks["post_run_cell"]) == hooks[1] - 1
    ip.run_line_magic("load_ext", "tunekit")  # the fixture unloads again


def test_load_ext_sets_the_renderer_and_unload_ext_puts_plotlys_back(ip):
    import plotly.io as pio

    ip.run_line_magic("unload_ext", "tunekit")
    before = pio.renderers.default
    ip.run_line_magic("load_ext", "tunekit")
    from tunekit.view.renderer import in_kernel

    assert pio.renderers.default == ("tunekit" if in_kernel() else "tunekit_file")
    ip.run_line_magic("unload_ext", "tunekit")
    assert pio.renderers.default == before
    ip.run_line_magic("load_ext", "tunekit")


def test_model_flops_and_peak_options_give_mfu(run):
    run("%%gpuprofile -q -n mfu --flops never --model-flops 2e9 --peak 10\nx = 1")
    rec = tunekit.last()
    assert rec.model_flops == 2e9 and rec.peak_tflops == 10
    assert rec.mfu == pytest.approx(2e9 / rec.wall_s / 1e12 / 10)


def test_experiment_frees_new_variables_and_records_the_leak_check(ip, run):
    # 128 MiB: RSS sees it even in a hole of the heap (the leak check trims the heap first)
    run("%%gpuprofile -q -n exp --experiment\nbig = torch.ones(32 * 2**20)")
    assert "big" not in ip.user_ns
    rec = tunekit.last()
    assert rec.name == "exp"
    assert rec.exp_cpu_consumed_bytes > 120 * 2**20
    assert rec.exp_cpu_reclaimed_bytes > 120 * 2**20
    assert "freed variables: big" in rec.notes


def test_a_one_time_side_effect_costs_one_recount_and_a_counter_none(run):
    # the first forward sets an attribute (a change the count cannot rule out: recount once);
    # `steps += 1` alone is a counter the cell keeps, not an input
    run("class Net(torch.nn.Linear):\n    def forward(self, x):\n        self.ran = 'yes'\n"
            "        return super().forward(x)\nnet = Net(128, 128, bias=False)\nsteps = 0")
    cell = "%%gpuprofile -q -n lazy\nnet(torch.randn(batch_size, 128)).sum().backward()\nsteps += 1"
    for _ in range(4):
        run(cell)
    recs = tunekit.history(all=True).iloc[-4:]
    assert list(recs.flops_source) == ["counted", "counted", "cached", "cached"]
    assert "recounted: net changed since the counted run" in recs.iloc[1].notes


def test_a_cell_that_grows_its_own_input_is_recounted_every_time(run):
    run("z = torch.randn(2, 128)")
    cell = "%%gpuprofile -q -n grow\nz = torch.cat([z, z])\nmodel(z).sum().backward()"
    for _ in range(3):
        run(cell)
    # rows 4, 8, 16 after each cat: 4*128*128*rows = 262144, 524288, 1048576
    assert list(tunekit.history().flops.iloc[-3:]) == [262144, 524288, 1048576]


def test_a_llama_cell_gets_model_flops_from_its_shape_when_counted_reused_and_under_on(run):
    pytest.importorskip("transformers")
    from tunekit.core.formulas import MFU_ANALYTIC

    run("from transformers import AutoModelForCausalLM, LlamaConfig\n"
        "llm = AutoModelForCausalLM.from_config(LlamaConfig(vocab_size=256, hidden_size=64, "
        "intermediate_size=172, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, "
        "max_position_embeddings=128, attn_implementation='eager'))\n"
        "xl = torch.randint(0, 256, (2, 64))\n"
        "def train_step():\n    llm(input_ids=xl, labels=xl).loss.backward()")
    # N = 107008 matmul weights, L = 2, width 64 (tests/measure/test_model_flops.py): per trained token
    # 6*107008 + 12*2*64*64/2 = 691200; x 2*64 tokens = 88473600, as the Lab counts it
    for _ in range(2):
        run("%%gpuprofile -q -n llama\nllm(input_ids=xl, labels=xl).loss.backward()")
    run("%%gpuprofile -q -n via_function\ntrain_step()")  # the model is a global of the function
    run("%gpuprofile on -q")
    run("train_step()")
    run("%gpuprofile off")
    df = tunekit.history(all=True).iloc[-4:]
    assert list(df.flops_source) == ["counted", "cached", "counted", "counted"]
    assert list(df.model_flops) == [88473600] * 4
    assert list(df.mfu_convention) == [MFU_ANALYTIC] * 4
    assert "MFU from the shape of `llm` (LlamaForCausalLM), as the Lab" in df.iloc[2].notes


# --- the magic is invisible: errors, line numbers, `;`, `_` and Out as in a plain cell ----------


def _error(r):
    return r.error_before_exec or r.error_in_exec


def test_a_syntax_error_in_a_magic_called_by_code_is_raised_and_not_a_run(ip):
    n = len(tunekit.history(all=True))
    with pytest.raises(SyntaxError):
        ip.run_cell_magic("gpuprofile", "-q -n by_code", "x = (")
    assert len(tunekit.history(all=True)) == n


def test_unloading_puts_ipythons_custom_exception_handlers_back():
    from IPython.core.interactiveshell import InteractiveShell

    from tunekit.profiling import cell_check

    shell = InteractiveShell.instance()
    before = (shell.custom_exceptions, shell.CustomTB)
    state = cell_check.install(shell)
    assert cell_check.CellError in shell.custom_exceptions
    cell_check.uninstall(shell, state)
    assert (shell.custom_exceptions, shell.CustomTB) == before


@pytest.mark.parametrize("body", ["x = (", "def f(:\n    pass", "a = 1\nb = )", "if True:\n        x = 1\n    y = 2",
                                  "return 5", "a = 1\nbreak", "f(**)", "x = 1 +"])
def test_a_syntax_error_is_the_one_a_plain_cell_raises_and_is_not_a_run(run, body, capsys):
    plain = _error(run(body))
    n = len(tunekit.history(all=True))
    capsys.readouterr()
    r = run("%%gpuprofile -q -n broken\n" + body)
    magic = _error(r)   # a subclass of the plain one's class, of the same name, marked for its display
    assert type(magic).__name__ == type(plain).__name__ and isinstance(magic, type(plain))
    assert (magic.msg, magic.text, magic.offset) == (plain.msg, plain.text, plain.offset)
    assert magic.lineno == plain.lineno + 1        # the cell's line: line 1 is %%gpuprofile
    assert len(tunekit.history(all=True)) == n     # a cell that never ran is not a run (issue 33)
    shown = capsys.readouterr()
    shown = shown.out + shown.err
    # only the cell's line ("Cell In[N], line L", or "<tokenize>:L" for the tokenizer's errors)
    assert f"line {magic.lineno}" in shown or f":{magic.lineno}" in shown
    assert "tunekit" not in shown and "run_cell_magic" not in shown


@pytest.mark.parametrize("body", ["1/0", "a = 1\nundefined_name", "raise KeyError('k')", "import no_such_module_tk",
                                  "def f():\n    return 1 / 0\nf()", "[1 / 0 for _ in range(2)]",
                                  "class C:\n    x = {}['missing']"])
def test_a_runtime_error_has_the_plain_type_message_and_cell_line(ip, run, body):
    import traceback

    plain = run(body)
    r = run("%%gpuprofile -q\n" + body)
    p, m = plain.error_in_exec, r.error_in_exec
    assert (type(m), str(m)) == (type(p), str(p))
    where = traceback.extract_tb(m.__traceback__)[-1]
    assert where.lineno == traceback.extract_tb(p.__traceback__)[-1].lineno + 1
    assert ip.compile.format_code_name(where.filename) == ("Cell", f"In[{r.execution_count}]")
    assert tunekit.last().error == f"{type(p).__name__}: {p}"


def test_a_rerun_of_the_same_cell_names_its_own_cell_in_the_traceback(ip, run):
    import traceback

    for _ in range(2):   # the second run reuses the compiled cell
        r = run("%%gpuprofile -q\ndef g():\n    return 1 / 0\ng()")
        where = traceback.extract_tb(r.error_in_exec.__traceback__)[-1]
        assert ip.compile.format_code_name(where.filename) == ("Cell", f"In[{r.execution_count}]")
        assert (where.lineno, where.line) == (3, "return 1 / 0")


@pytest.mark.parametrize("body", ["6 * 7;", "6 * 7", "6 * 7; # done", "'a;'", "y = 6 * 7;", "6 * 7;;", "print(1);"])
@pytest.mark.parametrize("options", ["-q", ""])
def test_result_underscore_and_out_are_those_of_a_plain_cell(ip, run, body, options):
    seen = []
    for src in (body, f"%%gpuprofile {options}\n{body}"):
        run("'before'")   # `_` is 'before' until a cell shows a result
        r = run(src)
        out = ip.user_ns["Out"]
        seen.append((r.result, out.get(r.execution_count, "absent"), ip.user_ns["_"]))
    assert seen[1] == seen[0]


def test_records_carry_the_number_the_notebook_shows(run):
    r = run("%%gpuprofile -q\nx = 1")
    assert tunekit.last().name == f"In[{r.execution_count}]"
    run("%gpuprofile on -q")
    r = run("y = 2")
    run("%gpuprofile off")
    assert tunekit.last().name == f"In[{r.execution_count}]"


# --- regressions from the review of the measurement core: each reproduced a real bug ----------------

# Linear 128x128 no bias, x needs no grad: forward 2 + weight-grad 2 FLOPs per weight per row
PER_ROW = 4 * 128 * 128  # 65536; 8 rows -> 524288


def _flops_of(run, src):
    run(src)
    rec = tunekit.last()
    return rec.flops, rec.flops_source


@pytest.mark.parametrize("last_line", ["%gpuprofile off", "%unload_ext tunekit"])
def test_turning_off_from_inside_a_cell_leaves_no_counter_active(ip, run, flop_counters, last_line):
    run("%gpuprofile on -q")
    run(f"y = model(torch.randn(2, 128))\n{last_line}")
    assert flop_counters() == []
    if last_line.startswith("%unload"):
        ip.run_line_magic("load_ext", "tunekit")  # the fixture unloads


def test_block_that_changes_its_own_input_recounts(run):
    run("bs = 4\ndef grow():\n    global bs\n    bs *= 2\n"
        "def step():\n    model(torch.randn(bs, 128)).sum().backward()")
    cell = "%%gpuprofile -q -n selfmod\ngrow()\nstep()"
    got = [_flops_of(run, cell)[0] for _ in range(3)]
    assert got == [8 * PER_ROW, 16 * PER_ROW, 32 * PER_ROW]   # bs 4 -> 8 -> 16 -> 32


def test_del_at_the_end_of_a_cell_does_not_hide_its_input(run):
    cell = "%%gpuprofile -q -n del\nmodel(x).sum().backward()\ndel x"
    run("x = torch.randn(8, 128)")
    assert _flops_of(run, cell) == (8 * PER_ROW, "counted")
    run("x = torch.randn(16, 128)")
    assert _flops_of(run, cell) == (16 * PER_ROW, "counted")  # 2 * 524288


def test_config_dict_change_recounts(run):
    cell = "%%gpuprofile -q -n cfg\nmodel(torch.randn(cfg['bs'], 128)).sum().backward()"
    run("cfg = {'bs': 8}")
    assert _flops_of(run, cell) == (8 * PER_ROW, "counted")
    run("cfg = {'bs': 16}")
    assert _flops_of(run, cell) == (16 * PER_ROW, "counted")


def test_numpy_input_shape_change_recounts(run):
    cell = "%%gpuprofile -q -n np\nmodel(torch.from_numpy(arr)).sum().backward()"
    run("arr = np.zeros((8, 128), np.float32)")
    assert _flops_of(run, cell) == (8 * PER_ROW, "counted")
    run("arr = np.zeros((16, 128), np.float32)")
    assert _flops_of(run, cell) == (16 * PER_ROW, "counted")


def test_redefined_function_recounts(run):
    cell = "%%gpuprofile -q -n f\nf()"
    seen = []
    for bs in (8, 16, 8, 16, 8, 16):
        # two definitions per round: the second can take the freed address of an older code object
        run(f"def f():\n    model(torch.randn({24 - bs}, 128)).sum().backward()")
        run(f"def f():\n    model(torch.randn({bs}, 128)).sum().backward()")
        seen.append(_flops_of(run, cell)[0])
    assert seen == [bs * PER_ROW for bs in (8, 16, 8, 16, 8, 16)]


def test_cell_reading_a_lazy_module_still_runs(ip, run):
    run("lazy = torch.nn.LazyLinear(8)")
    r = run("%%gpuprofile -q -n lazy\ny = lazy(torch.randn(2, 4))")
    assert r.error_in_exec is None and ip.user_ns["y"].shape == (2, 8)


def test_top_level_await_in_the_cell_magic_is_a_clear_usage_error(run):
    # IPython hands the magic the cell body as text; compiling it outside the kernel's event loop
    # fails on `await`, and the magic turns that into a UsageError before any measurement starts
    run("import asyncio")
    n0 = len(tunekit.history())
    r = run("%%gpuprofile -q -n aw\nawait asyncio.sleep(0)\n1")
    assert type(r.error_in_exec) is UsageError
    msg = str(r.error_in_exec)
    assert "cannot run top-level `await`" in msg and "use `%gpuprofile on`" in msg
    assert r.result is None
    assert len(tunekit.history()) == n0         # nothing ran, so nothing was recorded


def test_compact_display_says_why_tflops_is_missing(run, capsys):
    run("%gpuprofile on")
    run("y = model(torch.randn(4, 128))")
    out = capsys.readouterr().out
    assert "n/a" in out and "re-run" in out


def test_a_gpt_profiled_again_reuses_its_count(run):
    """The README's example: the second run of a cell that trains tunekit's GPT reuses the count.
    What the first forward records (the attention that ran) is an outcome, not a setting: it
    must not look like a changed input."""
    run("import tunekit\ngpt = tunekit.GPT(tunekit.GPTConfig(n_layer=1, n_embd=32, n_head=2, block_size=16))\n"
        "xs, ys = torch.randint(0, 256, (2, 2, 16))")
    cell = "%%gpuprofile -q -n gpt-step\ngpt(xs, ys)[1].backward()"
    run(cell)
    run(cell)
    a, b = tunekit.history().iloc[-2:].to_dict("records")
    assert a["flops_source"] == "counted" and b["flops_source"] == "cached", b["notes"]


def test_time_changed_note_says_slower_or_faster(run):
    """A re-run reusing the count whose time moved a lot says so in words a reader can use
    (a 30x faster run once read 'time changed 0.0x')."""
    import re

    run("naps = [0.3]")   # floats in a list are not in the fingerprint: the count is reused
    cell = "%%gpuprofile -q -n nap\nimport time\ntime.sleep(naps[0])"
    run(cell)
    run(cell)
    run("naps[0] = 0.005")
    run(cell)
    assert tunekit.last().flops_source == "cached"
    note = next(n for n in tunekit.last().notes if n.startswith("time changed"))
    assert re.match(r"time changed since the last run on this count \(\d+\.\dx faster\)", note), note
    run("naps[0] = 0.3")
    run(cell)
    note = next(n for n in tunekit.last().notes if n.startswith("time changed"))
    assert re.match(r"time changed since the last run on this count \(\d+\.\dx slower\)", note), note


def test_a_traced_cell_with_a_plan_shows_its_line_and_bad_plans_are_refused_before_the_cell(run):
    from tunekit.core.fmt import fmt_ms

    run("import tunekit, types\nfrom tunekit.core.notes import Note\n"
        "lab = tunekit.Lab(seq_len=32, micro_batch=2); p = lab.plan('cpu'); t = lab.resolve(); lab.apply(t)\n"
        "bare = types.SimpleNamespace(expected=None, notes=[Note('expected.missing', 'no figure for X')])")
    r = run("%%gpuprofile -q -n two --trace --plan p --steps 2\nfor _ in range(2):\n    lab.train_step(t)")
    assert r.error_in_exec is None
    rec = tunekit.last()
    assert rec.explained.startswith(f"{fmt_ms(rec.trace.wall_s / 2)} per step, ")   # two steps in the trace
    assert rec.explained == tunekit.explain(rec, run("p").result, steps=2).line
    assert f"  vs plan    {rec.explained}" in repr(rec).splitlines()
    run("%%gpuprofile -q --trace\nlab.train_step(t)")
    assert tunekit.last().explained is None                                          # no plan, no line
    for bad, words in (("--trace --plan nope", "no variable 'nope' in the notebook"),
                       ("--trace --plan batch_size", "batch_size is of type int, not a Plan"),
                       ("--trace --plan bare", "has no expected step to set the run against: no figure for X"),
                       ("--plan p", "add --trace"), ("--trace --plan p --steps 0", "--steps is how many"),
                       ("--trace --steps 3", "give --plan NAME with it"), ("on --trace --plan p", "for one cell")):
        n = len(tunekit.history())
        r = run(f"%%gpuprofile -q {bad}\nran = True") if not bad.startswith("on") else run(f"%gpuprofile {bad}")
        assert isinstance(r.error_in_exec, UsageError) and words in str(r.error_in_exec), bad
        assert "ran" not in run("dir()").result and len(tunekit.history()) == n, bad   # the cell never ran
