"""IPython magics: ``%%gpuprofile`` for one cell, ``%gpuprofile on|off`` for every cell.

Parse the options, hand the cell to a Probe, display the record. Nothing here measures.
"""
from __future__ import annotations

import ast
import types

from IPython.core.displayhook import DisplayHook
from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from tunekit.core.records import ProfileRecord
from tunekit.core.registry import DTYPES
from tunekit.core.summary import Summary
from tunekit.measure.history import HISTORY, source_key
from tunekit.measure.interrupts import closes_gate, deferred_interrupt, end_shown, opens_gate
from tunekit.profiling.cell_check import cell_syntax_error, install, uninstall
from tunekit.profiling.fingerprint import cell_inputs, fingerprint, modules_seen, names_read
from tunekit.profiling.options import check, explain_record, planned, wants_help
from tunekit.profiling.probe import FLOPS_MODES, Probe

# cells `%gpuprofile on` does not profile: the cell magic measures itself, on/off cells are not workload
_NOT_PROFILED = ("%gpuprofile", "%%gpuprofile", "%unload_ext", "%reload_ext")


@magics_class
class GpuProfileMagics(Magics):
    def __init__(self, shell):
        super().__init__(shell)
        self.auto_opts = None   # options of `%gpuprofile on`, None when off
        self._probe = None      # the probe of the cell running under `on`
        self._shield = None     # the running cell's Ctrl-C shield, pre_run_cell to post_run_cell
        self._cells = {}        # id -> ExecutionInfo of the cells whose pre_run_cell got its shield on
        self._began = False     # the running cell's %%gpuprofile reached its shield
        self._fresh = False     # `on` came inside the running cell (its pre_run_cell did not see it)
        self._compiled = {}     # cell text -> compiled code (re-runs skip parse and compile)
        self._args = {}         # option line -> parsed options

    @magic_arguments()
    @argument("mode", nargs="?", choices=["on", "off"],
              help="line magic only: profile every following cell (on) or stop (off)")
    @argument("-n", "--name", help="name of the record (default: In[N])")
    @argument("-q", "--quiet", action="store_true", help="record without displaying")
    @argument("--flops", default="auto", choices=FLOPS_MODES,
              help="auto: count on the first run and when inputs change, reuse otherwise; "
                   "always: count every run (no TFLOPS then: the counter slows the run); never")
    @argument("--model-flops", type=float, default=None,
              help="model FLOPs of the cell for MFU (default: tunekit's convention, from the shape of the "
                   "model the cell ran, else from the count: 6N per token + causal attention at half)")
    @argument("--peak", type=float, default=None, help="peak TFLOPS to use instead of the spec sheet/MAMF")
    @argument("--dtype", default=None, choices=tuple(DTYPES),
              help="dtype whose peak is used (default: bf16 on CUDA, fp32 on CPU)")
    @argument("--experiment", action="store_true",
              help="run as a tunekit.experiment: variables the cell creates are freed, leaks reported")
    @argument("--trace", action="store_true",
              help="trace the run with torch.profiler: time by op category, top ops, a Chrome trace, "
                   "from the first run on (a traced run counts no FLOPs: it reuses a count of the same "
                   "inputs, else a run without --trace counts them)")
    @argument("--memory", action="store_true",
              help="memory timeline by category (parameters, gradients, optimizer state, activations) "
                   "from torch.profiler's memory profiler; on CUDA also a memory_viz snapshot")
    @argument("--plan", default=None, metavar="NAME",
              help="with --trace: a Plan in the notebook (p = tunekit.plan(...)); the summary sets the traced "
                   "step against its expected step in one line (tunekit.explain)")
    @argument("--steps", type=int, default=1, help="with --plan: how many training steps the cell runs")
    @line_cell_magic
    def gpuprofile(self, line, cell=None):
        """Profile a cell: time, CPU/GPU memory, FLOPs, TFLOPS, MFU/HFU.

        Examples::

            %load_ext tunekit
            %%gpuprofile -n step
            loss = model(x, y)[1]; loss.backward()

            %gpuprofile on --dtype bf16     # every following cell
            %gpuprofile off

            %%gpuprofile --trace --memory  # why: time by op category, memory timeline
            %%gpuprofile --trace --plan p  # and the step against p's expected step (p = tunekit.plan(...))

        Results: ``tunekit.history()`` (DataFrame), ``tunekit.last()`` (record).
        """
        __tracebackhide__ = True  # noqa: F841  (keeps this frame out of user tracebacks)
        # Ctrl-C waits until the probe is on, or off and the cell recorded; the cell itself runs
        # in the shield's gate. (A Ctrl-C before this line: post_run_cell records the cell.)
        with deferred_interrupt() as shield:
            if cell is not None:
                self._began = True
            return self._magic(line, cell, shield)

    def _magic(self, line, cell, shield):
        __tracebackhide__ = True  # noqa: F841
        if wants_help(line):   # the usage (as `%%gpuprofile?` shows it), and nothing run
            return print(self.gpuprofile.__doc__.removeprefix("::\n\n"))
        args = self._args.get(line) or parse_argstring(self.gpuprofile, line)
        check(args)                # a bad line raises before it is kept for reuse
        if len(self._args) > 256:  # bounded, like the compiled cells
            self._args.clear()
        self._args[line] = args
        if cell is None:
            return self._line(args)
        if args.mode:
            raise UsageError("%%gpuprofile takes options, not on/off (that is the line magic %gpuprofile on)")
        return self._run_cell(args, cell, shield, line)

    # --- one cell ------------------------------------------------------------------------------

    def _run_cell(self, args, cell, shield, line=""):
        __tracebackhide__ = True  # noqa: F841
        number = self._cell_number()
        name = args.name or f"In[{number}]"
        code, error = cell, None
        try:
            code = self.shell.transform_cell(cell)
        except SyntaxError as e:  # IPython's tokenizer (an IndentationError): count the magic's line
            error, e.lineno = e, e.lineno + 1 if isinstance(e.lineno, int) else e.lineno
        if error is None:
            try:
                body, tail = self._compile(code, cell, number, f"%%gpuprofile {line}".rstrip())
            except SyntaxError as e:
                error = e
        if error is not None:  # a cell that never ran is not a run: nothing recorded; shown as a
            raise cell_syntax_error(error) from None  # plain cell's (cell_check), no frames of ours
        ns = self.shell.user_ns
        plan = planned(ns, args)  # --plan: looked up on every run, refused before the cell runs
        probe = self._probe_for(args, code, name)
        shield.doing = f"saving the record of {name}"   # a second Ctrl-C's note (measure.interrupts)
        exp = self._start_experiment(name, args, probe)
        if exp is None:
            probe.start()
        try:
            with shield.gate():  # the cell's own code: the one part a Ctrl-C stops at once
                exec(body, ns)
                result = eval(tail, ns) if tail is not None else None
        except BaseException as e:  # KeyboardInterrupt too: recorded, then re-raised unchanged
            self._finish(probe, exp, args, e, plan)
            raise
        self._finish(probe, exp, args, None, plan)
        # IPython's displayhook sees only this magic's call, so it cannot tell that the cell ends
        # in `;`: hide the result here, as a plain cell would (no Out[N], `_` unchanged)
        return None if tail is not None and DisplayHook.semicolon_at_end_of_expression(code) else result

    def _cell_number(self) -> int:
        """N of the running cell's In[N] (IPython 9 already counts the next cell while one runs)."""
        running = getattr(self.shell.displayhook, "exec_result", None)
        return getattr(running, "execution_count", None) or self.shell.execution_count

    def _compile(self, code, cell, number, header):
        """(statements, last expression or None) of the cell, parsed and compiled as IPython does
        (its flags, __future__ imports, AST transformers), so a SyntaxError is the one a plain cell
        raises. Line numbers are the cell's: line 1 is the ``%%gpuprofile`` line. Compiled once
        per distinct cell text; each run gets its own ``In[N]`` in tracebacks."""
        compiler = self.shell.compile
        # registers the source with linecache, so tracebacks show the cell's lines
        filename = compiler.cache(f"{header}\n{code}", number, raw_code=f"{header}\n{cell}")
        if code not in self._compiled:
            tree = self.shell.transform_ast(compiler.ast_parse("\n" + code, filename=filename))
            last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
            try:
                body = compiler(ast.Module(tree.body, type_ignores=[]), filename, "exec")
                tail = compiler(ast.Expression(last.value), filename, "eval") if last is not None else None
            except SyntaxError as e:
                if "await" in str(e):  # running a coroutine needs the kernel's own loop
                    raise UsageError("%%gpuprofile cannot run top-level `await`; use `%gpuprofile on`, "
                                     "which profiles the cell as IPython runs it") from None
                raise
            if len(self._compiled) > 256:  # bounded: re-runs of recent cells skip parsing
                self._compiled.clear()
            self._compiled[code] = body, tail
        body, tail = self._compiled[code]
        if body.co_filename != filename:   # a re-run: its own In[N]
            body, tail = _renamed(body, filename), tail and _renamed(tail, filename)
        return body, tail

    def _probe_for(self, args, code, name):
        names = names_read(code)
        fp = lambda: fingerprint(self.shell.user_ns, names)  # noqa: E731
        models = lambda: modules_seen(self.shell.user_ns, names)  # noqa: E731
        return Probe(name, key=source_key(code, args.name or ""), fingerprint=fp, flops=args.flops,
                     model_flops=args.model_flops, peak=args.peak, dtype=args.dtype,
                     trace=args.trace, memory=args.memory, models=models)

    def _start_experiment(self, name, args, probe):
        if not args.experiment:
            return None
        from tunekit.profiling.experiments import experiment

        # the experiment starts and stops the probe, so its record carries the leak check too
        return experiment(name, namespace=self.shell.user_ns, quiet=True, probe=probe).__enter__()

    def _finish(self, probe, exp, args, error, plan=None):
        if exp is not None:
            exp.__exit__(type(error) if error else None, error, None)
        else:
            probe.stop(error)
        explain_record(probe.record, plan, args.steps)  # after the probe stopped: nothing here is measured
        if not args.quiet:
            self._display(probe.record)

    def _display(self, rec, compact=False):
        from IPython.display import display

        # a ready mimebundle: skips the formatter's probing of a dozen repr methods per cell
        summary = Summary(rec, compact=compact)
        display({"text/plain": repr(summary), "text/html": summary._repr_html_()}, raw=True)
        if rec.trace is not None or rec.memory is not None:
            from tunekit.view.trace_plots import show_trace

            show_trace(rec)

    # --- every cell ----------------------------------------------------------------------------
    # pre_run_cell and post_run_cell run for every cell while the extension is loaded: between
    # them the cell runs inside a Ctrl-C shield whose gate is open, so that a Ctrl-C landing in
    # tunekit's own lines (the magic's first line, post_run_cell's first line) cannot tear a
    # probe or lose a record. IPython swallows a callback's KeyboardInterrupt (it prints it).

    def _line(self, args):
        if args.mode is None:
            raise UsageError("use %gpuprofile on [options] | off, or %%gpuprofile as a cell magic")
        if args.mode == "on":
            if args.experiment or args.trace or args.memory:
                raise UsageError("--experiment, --trace and --memory are for one cell (%%gpuprofile --trace)")
            self.auto_opts, self._fresh = args, True
        else:
            self.stop_auto()

    def stop_auto(self):
        with deferred_interrupt():
            probe, self._probe = self._probe, None
            if probe is not None and probe.running:
                # turned off from inside the profiled cell: close its record now (and its FLOP
                # counter), since post_run_cell no longer closes it
                probe.record.notes.append("profiling was turned off inside this cell: measured up to there")
                probe.stop(None)
            self.auto_opts = None

    @opens_gate  # a KeyboardInterrupt here leaves the gate open: IPython runs the cell anyway
    def pre_run_cell(self, info=None, *args):
        shield = deferred_interrupt().__enter__()
        if len(self._cells) > 64:  # cells whose post_run_cell never came
            self._cells.clear()
        self._cells[id(info)] = info
        left, self._shield = self._shield, shield
        if left is not None or self._probe is not None:  # the last cell's post_run_cell never came
            self._close_left(left)
        self._began = False
        raw = getattr(info, "raw_cell", "") or ""
        try:
            if self.auto_opts is not None and not raw.lstrip().startswith(_NOT_PROFILED):
                self._probe = self._start_probe(raw, getattr(info, "transformed_cell", None), shield.active)
        finally:
            shield.open = True  # the cell runs interruptible, also when its probe could not start
        if shield.pending:  # a Ctrl-C from the lines above: IPython shows it, then runs the cell
            shield.pending = False
            raise KeyboardInterrupt

    def _start_probe(self, raw, code=None, held=False):
        a = self.auto_opts
        if code is None:  # IPython < 9 does not hand the hook the cell it transformed
            code = raw if not raw.lstrip().startswith("%") else ""
            try:
                code = self.shell.transform_cell(raw)
            except Exception:
                pass
        ns = self.shell.user_ns
        names, inert, trivial = cell_inputs(code, ns)
        fp = lambda: fingerprint(ns, names)  # noqa: E731
        models = lambda: modules_seen(ns, names)  # noqa: E731
        probe = Probe(f"In[{self.shell.execution_count}]", key=source_key(code), fingerprint=fp,
                      flops=a.flops, model_flops=a.model_flops, peak=a.peak, dtype=a.dtype,
                      models=models, inert=inert, trivial=trivial)
        return probe.start_held() if held else probe.start()  # held: the hook's own shield holds Ctrl-C

    def _close_left(self, shield):
        probe, self._probe = self._probe, None
        if probe is not None and probe.running:
            probe.record.notes.append("closed at the next cell (the cell was interrupted)")
            probe.stop(None)
        if shield is not None:
            shield.open = shield.pending = False  # that cell is over, and so is its Ctrl-C
            shield.__exit__(None, None, None)

    @closes_gate  # the cell's gate is still open when IPython calls it: Ctrl-C waits from here on
    def post_run_cell(self, result=None, *args):
        shield = self._shield if self._shield is not None else deferred_interrupt().__enter__()
        shield.open = False
        error = None
        try:
            self._record_cell(result, shield.active)
        except BaseException as e:
            error = e
            raise
        finally:
            self._shield = None
            # a Ctrl-C from meanwhile is raised (IPython shows it), or said if the cell stopped on one
            end_shown(shield, error, getattr(result, "error_in_exec", None), "saving the cell's record")

    def _record_cell(self, result, held=False):
        probe, self._probe = self._probe, None
        began, self._began = self._began, False
        fresh, self._fresh = self._fresh, False
        seen = self._cells.pop(id(getattr(result, "info", None)), None) is not None
        raw = (getattr(getattr(result, "info", None), "raw_cell", None) or "").lstrip()
        error = getattr(result, "error_in_exec", None) or getattr(result, "error_before_exec", None)
        number = getattr(result, "execution_count", None)
        if probe is not None:
            if number:  # IPython 9 counted on before pre_run_cell
                probe.record.name = f"In[{number}]"
            if probe.running:
                rec = probe.stop_held(error) if held else probe.stop(error)  # held: by post_run_cell's shield
                if self.auto_opts is not None and not self.auto_opts.quiet:
                    self._display(rec, compact=True)
        elif raw.startswith("%%gpuprofile") and not began and isinstance(error, KeyboardInterrupt):
            self._unmeasured(self._cell_name(raw, number), "interrupted before %%gpuprofile started")
        elif self.auto_opts is not None and not fresh and not seen and raw \
                and not raw.startswith(_NOT_PROFILED):
            self._unmeasured(f"In[{number}]", "a Ctrl-C stopped tunekit before the cell; IPython ran it "
                                              "anyway, unmeasured")

    def _cell_name(self, raw, number):
        try:
            name = parse_argstring(self.gpuprofile, raw.splitlines()[0][len("%%gpuprofile"):]).name
        except Exception:  # a bad option line: the cell has no name of its own
            name = None
        return name or f"In[{number}]"

    @staticmethod
    def _unmeasured(name, why):
        HISTORY.append(ProfileRecord(name=name, error="KeyboardInterrupt", notes=[f"{why}: nothing measured"]))

    def end_cell(self):
        """End the running cell's shield now (unload: its post_run_cell will not come)."""
        shield, self._shield = self._shield, None
        if shield is not None:
            shield.open = False
            shield.__exit__(None, None, None)


def _renamed(code: types.CodeType, filename: str) -> types.CodeType:
    """``code`` with every code object in it (functions, classes, comprehensions) as if compiled
    from ``filename``."""
    consts = tuple(_renamed(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


_STATE = {"magics": None}


def _use_renderer() -> None:
    try:
        from tunekit.view.renderer import use_renderer

        use_renderer()
    except Exception as e:  # noqa: BLE001 - the magic works whatever befalls plotly's renderer
        import warnings

        warnings.warn(f"tunekit: plotly's renderer left as plotly chose it ({type(e).__name__}: {e})",
                      stacklevel=2)


def load_ipython_extension(ip):
    """``%load_ext tunekit``: register the magics once, however often it is called, and make
    tunekit's plotly renderer the default (``view.renderer``)."""
    if _STATE["magics"] is not None:
        return
    with deferred_interrupt():  # registered whole, or not at all
        magics = GpuProfileMagics(ip)
        ip.register_magics(magics)
        ip.events.register("pre_run_cell", magics.pre_run_cell)
        ip.events.register("post_run_cell", magics.post_run_cell)
        _STATE["check"] = install(ip)
        _STATE["magics"] = magics
    _use_renderer()


def unload_ipython_extension(ip):
    """``%unload_ext tunekit``: remove the magics and every event hook; plotly's renderer back
    as it was."""
    magics = _STATE["magics"]
    if magics is None:
        return
    with deferred_interrupt():  # removed whole
        magics.stop_auto()
        ip.events.unregister("pre_run_cell", magics.pre_run_cell)
        ip.events.unregister("post_run_cell", magics.post_run_cell)
        uninstall(ip, _STATE.pop("check"))
        for kind in ("line", "cell"):
            ip.magics_manager.magics[kind].pop("gpuprofile", None)
        ip.magics_manager.registry.pop(type(magics).__name__, None)
        _STATE["magics"] = None
        magics.end_cell()
    from tunekit.view.renderer import restore_renderer

    restore_renderer()
