"""Has what a block reads changed since its FLOPs were counted? Cheap summaries of its inputs.

A FLOP count is reused only while the block's inputs look the same: tensor and array shapes,
dtypes and devices, scalar values, module settings, the code of the functions it calls and the
globals those read. Anything unclear errs toward "changed": an extra count costs one slow run,
a stale count would be a silently wrong TFLOPS.
"""
from __future__ import annotations

import ast
import functools
import keyword
import linecache
import re
import sys
import types

from tunekit.core.records import ProfileRecord
from tunekit.measure.device import torch_if_loaded

_SCALARS = (bool, int, float, str, type(None))
MAX_ITEMS = 32
MAX_DEPTH = 3


class Unknown:
    """A summary that equals nothing, not even itself: forces a recount."""

    def __eq__(self, other):
        return False

    def __hash__(self):
        return id(self)


def describe(value, depth: int = 0):
    """A hashable summary of a value: shapes for tensors and arrays, values for scalars."""
    if isinstance(value, _SCALARS):
        return value
    torch = torch_if_loaded()
    if torch is not None:
        if isinstance(value, torch.Tensor):
            if isinstance(value, torch.nn.parameter.UninitializedParameter):
                return ("lazy",)
            return ("T", tuple(value.shape), str(value.dtype), str(value.device), value.requires_grad)
        if isinstance(value, torch.nn.Module):
            return ("M", type(value).__name__, _module_state(value))
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if isinstance(shape, tuple) and dtype is not None:  # numpy arrays and scalars, jax arrays...
        return ("A", shape, str(dtype), value.item() if shape == () and hasattr(value, "item") else None)
    if isinstance(value, (types.ModuleType, type)):
        return ("mod", getattr(value, "__name__", "?"))
    if isinstance(value, types.FunctionType):
        # code objects compare by value: a redefined function with new code is a new input
        return ("F", value.__code__, _function_globals(value, depth)) if depth < MAX_DEPTH else ("F", value.__code__)
    if depth >= MAX_DEPTH:
        return type(value).__name__
    if isinstance(value, functools.partial):
        return ("P", describe(value.func, depth + 1), describe(value.args, depth + 1),
                describe(value.keywords, depth + 1))
    if isinstance(value, types.MethodType):
        return ("BM", describe(value.__func__, depth + 1), describe(value.__self__, depth + 1))
    # Containers: what decides the work (shapes, small ints, switches) is described; what grows
    # as a side effect (a losses list of floats, optimizer state keyed by parameters) is not.
    if isinstance(value, tuple):
        return ("tuple", len(value)) + tuple(describe(v, depth + 1) for v in value[:MAX_ITEMS])
    if isinstance(value, list):
        return ("list",) + tuple(describe(v, depth + 1) for v in value[:MAX_ITEMS] if not isinstance(v, float))
    if isinstance(value, dict):
        return ("dict",) + tuple((k, describe(v, depth + 1)) for k, v in list(value.items())[:MAX_ITEMS]
                                 if isinstance(k, str) and not isinstance(v, float))
    d = getattr(value, "__dict__", None)
    if isinstance(d, dict):
        return (type(value).__name__,) + tuple(
            (k, describe(v, depth + 1)) for k, v in list(d.items())[:MAX_ITEMS]
            if not k.startswith("__") and not isinstance(v, float))
    return type(value).__name__


def _module_state(module) -> tuple:
    from tunekit.models.adapters import adapt  # torch is loaded: a module exists

    # Every submodule's switches (training flag, checkpointing, attention choice, sizes): flipping
    # one can change the work. Floats (dropout p, running scalars) do not change FLOPs.
    state = []
    for name, sub in module.named_modules():
        state.append((name, type(sub).__name__, sub.training, tuple(
            (k, v) for k, v in sub.__dict__.items() if type(v) in (bool, int, str) and k[0] != "_")))
    # what the model's adapter sees: attention kind (transformers keeps it in a private config
    # field), checkpointing, every parameter dtype, train/eval mode
    state.append(("adapter", adapt(module).state()))
    for p in module.parameters():  # dtype and device of the first parameter (a .to() or .half())
        state.append(("lazy",) if isinstance(p, torch_if_loaded().nn.parameter.UninitializedParameter)
                     else (str(p.dtype), str(p.device)))
        break
    return tuple(state)


def _function_globals(fn, depth: int) -> tuple:
    g = fn.__globals__
    names = tuple(n for n in fn.__code__.co_names if n in g)
    cells = tuple(describe(c.cell_contents, depth + 1) for c in (fn.__closure__ or ()) if _cell_ok(c))
    defaults = describe(fn.__defaults__, depth + 1) if fn.__defaults__ else None
    return tuple((n, describe(g[n], depth + 1)) for n in names), cells, defaults


def _cell_ok(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018  (reading an empty cell raises)
        return True
    except ValueError:  # an empty closure cell
        return False


def fingerprint(namespace: dict, names) -> tuple:
    """Summaries of `names` in `namespace`; a value that cannot be summarized forces a recount."""
    out = []
    for n in sorted(set(names)):
        if n in namespace and not isinstance(namespace[n], ProfileRecord):
            try:
                out.append((n, describe(namespace[n])))
            except Exception:
                out.append((n, Unknown()))
    return tuple(out)


def modules_seen(namespace: dict, names) -> list[tuple[str, object]]:
    """(name, module) for every torch module among `names` in `namespace`, looked for where
    `describe` looks (containers, objects' attributes, the globals and closures of functions,
    bound methods), not inside modules. What a block reads that can run a model."""
    torch = torch_if_loaded()
    if torch is None:
        return []
    found = {}

    def walk(value, label, depth):
        if isinstance(value, torch.nn.Module):
            found.setdefault(id(value), (label, value))
        elif depth >= MAX_DEPTH or isinstance(value, (*_SCALARS, torch.Tensor, types.ModuleType, type)):
            return
        elif isinstance(value, types.FunctionType):
            g = value.__globals__
            for n in value.__code__.co_names:
                if n in g:
                    walk(g[n], n, depth + 1)
            for n, c in zip(value.__code__.co_freevars, value.__closure__ or ()):
                if _cell_ok(c):
                    walk(c.cell_contents, n, depth + 1)
        elif isinstance(value, types.MethodType):
            walk(value.__self__, label, depth + 1)
        elif isinstance(value, functools.partial):
            for v in (value.func, *value.args, *value.keywords.values()):
                walk(v, label, depth + 1)
        elif isinstance(value, (tuple, list)):
            for v in value[:MAX_ITEMS]:
                walk(v, label, depth + 1)
        elif isinstance(value, dict):
            for v in list(value.values())[:MAX_ITEMS]:
                walk(v, label, depth + 1)
        elif isinstance(getattr(value, "__dict__", None), dict):
            for k, v in list(value.__dict__.items())[:MAX_ITEMS]:
                if not k.startswith("__"):
                    walk(v, f"{label}.{k}", depth + 1)

    for n in sorted(set(names)):
        if n in namespace:
            try:
                walk(namespace[n], n, 0)
            except Exception:  # an object that cannot be walked hides no model we could use
                pass
    return list(found.values())


def changed_names(old: tuple, new: tuple) -> list[str]:
    """What changed between two fingerprints, for a note: the names read whose summaries differ;
    for a function whose code is the same, the globals, closure cells or defaults it reads that
    differ (``"x, y (read by train_step)"``), not the function itself."""
    before = dict(old)
    after = dict(new)
    out = []
    for n in sorted(set(before) | set(after)):
        a, b = before.get(n, Unknown()), after.get(n, Unknown())
        if a != b:
            inner = _function_change(a, b)
            out.append(f"{inner} (read by {n})" if inner else n)
    return out


def _function_change(a, b) -> str | None:
    """For two summaries of one function (``("F", code, reads)``) with the same code: which of
    what it reads changed (its globals by name, else its closure or defaults); None otherwise."""
    if not (isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) == 3
            and a[0] == b[0] == "F" and a[1] == b[1]):
        return None
    (ga, *rest_a), (gb, *rest_b) = a[2], b[2]   # (globals by name, closure cells, defaults)
    if [n for n, _ in ga] != [n for n, _ in gb]:
        return None
    named = [x[0] for x, y in zip(ga, gb) if x != y]
    if named:
        return ", ".join(named)
    return "its closure or defaults" if rest_a != rest_b else None


# --- which names are inputs -------------------------------------------------------------------


class _FirstUse(ast.NodeVisitor):
    """Visit in evaluation order and note each name's first use: read or written.

    `visit` and `generic_visit` do what ast.NodeVisitor's do (the same order: each node's
    ``_fields``), with the method looked up once per node class and no generator per node: a
    profiled cell is parsed and visited before it runs, on every new cell."""

    _methods: dict = {}  # node class -> the method that visits it

    def __init__(self):
        self.first: dict[str, str] = {}
        self.aug_only: set[str] = set()
        self.read_elsewhere: set[str] = set()

    def visit(self, node):
        cls = node.__class__
        method = _FirstUse._methods.get(cls)
        if method is None:
            method = _FirstUse._methods[cls] = getattr(_FirstUse, "visit_" + cls.__name__, _FirstUse.generic_visit)
        return method(self, node)

    def generic_visit(self, node):
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, list):
                for item in value:
                    if isinstance(item, ast.AST):
                        self.visit(item)
            elif isinstance(value, ast.AST):
                self.visit(value)

    def _leaf(self, node):  # nothing below it names anything
        pass

    # (NodeVisitor's own visit_Constant looks for the deprecated visit_Num, visit_Str, ...)
    visit_Constant = visit_Load = visit_Store = visit_Del = _leaf

    def _use(self, name: str, kind: str) -> None:
        self.first.setdefault(name, kind)
        if kind == "read":
            self.read_elsewhere.add(name)

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load):
            self._use(node.id, "read")
        elif isinstance(node.ctx, ast.Store):
            self._use(node.id, "write")
        # `del x` neither reads nor defines an input

    def visit_Assign(self, node):
        self.visit(node.value)          # the value is evaluated before the targets are bound
        for t in node.targets:
            self.visit(t)

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self.visit(node.value)
        self.visit(node.target)

    def visit_AugAssign(self, node):
        self.visit(node.value)
        if isinstance(node.target, ast.Name):
            # `step += 1` alone is a counter the block keeps, not an input; read anywhere else,
            # the name is an input (see names_read)
            self.aug_only.add(node.target.id)
            self.first.setdefault(node.target.id, "aug")
        else:
            self.visit(node.target)

    def visit_NamedExpr(self, node):
        self.visit(node.value)
        self.visit(node.target)

    def visit_For(self, node):
        self.visit(node.iter)
        self.visit(node.target)
        for n in node.body + node.orelse:
            self.visit(n)

    visit_AsyncFor = visit_For

    def _define(self, node):
        for d in getattr(node, "decorator_list", []):
            self.visit(d)
        self._use(node.name, "write")
        self.generic_visit(node)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _define

    def visit_Import(self, node):
        for a in node.names:
            self._use((a.asname or a.name).split(".")[0], "write")

    visit_ImportFrom = visit_Import


@functools.lru_cache(maxsize=4)
def _parsed(source: str):
    """The AST of a block's source (None: not Python), parsed once for `names_read` and
    `runs_nothing`, which a profiled cell asks in turn. Read only, never changed."""
    try:
        return ast.parse(source)
    except SyntaxError:
        return None


# a one-line binding of a name to a number or a name (`lr = 3e-4`, `x = y`): read without a parse
_ONE_BINDING = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)[ \t]*=[ \t]*(?:(?:0|[1-9][0-9]*)(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?"
                          r"|([A-Za-z_][A-Za-z0-9_]*))[ \t]*\n?")


@functools.lru_cache(maxsize=4)  # (a cell's source, asked again when it is re-run or checked by hand)
def _one_binding(source: str) -> tuple[str, str | None] | None:
    """(the name bound, the name read or None) of a one-line binding (`_ONE_BINDING`), else None."""
    read = (m := _ONE_BINDING.fullmatch(source)) and m[2]
    bad = m is None or keyword.iskeyword(m[1]) or (read not in ("True", "False", "None") and keyword.iskeyword(read))
    return None if bad else (m[1], None if read in ("True", "False", "None") else read)


def cell_inputs(source: str, namespace=None) -> tuple[frozenset, bool, bool]:
    """``(names_read, runs_nothing, allocates_little)`` of a block in one look: what a profiled cell
    asks before it runs. A one-line binding is read from its text alone (~15 us less); anything
    else is parsed once, or found in the caches. It allocates little (it surely moves glibc's totals
    by far less than a `memory.rss_unseen` note's 16 MiB) when it binds a name that held nothing, or
    a number or string under 1 MiB (nothing large released); anything else, or no ``namespace``: False."""
    one = _one_binding(source)
    if one is None:
        return names_read(source), runs_nothing(source), False
    held = None if namespace is None else namespace.get(one[0], None)
    little = namespace is not None and (held is None or (type(held) in _SMALL and sys.getsizeof(held) < 2**20))
    return _NO_NAMES if one[1] is None else frozenset((one[1],)), True, little


_NO_NAMES, _SMALL = frozenset(), (int, float, bool, complex, str, bytes)


@functools.lru_cache(maxsize=512)
def names_read(source: str) -> frozenset:
    """Names a block reads before (or without) assigning them: its inputs.

    A name it only writes (its outputs) or only bumps (`step += 1`) is not an input, so those do
    not make every run look new; `x = torch.cat([x, x])` reads x first, so x is an input.

    >>> sorted(names_read("for i in range(n): y = f(x, i)"))
    ['f', 'n', 'range', 'x']
    """
    tree = _parsed(source)
    if tree is None:
        return frozenset()
    v = _FirstUse()
    v.visit(tree)
    inputs = {n for n, kind in v.first.items() if kind == "read"}
    return frozenset(inputs | (v.aug_only & v.read_elsewhere))


@functools.lru_cache(maxsize=512)
def runs_nothing(source: str) -> bool:
    """Whether a block's code can run no operation: it only binds names to literals or to what
    other names hold (``lr = 3e-4``, ``steps = n``, ``pass``, comments). It does 0 FLOPs, known
    without a counter. Anything else may run code and is False: a call, an operator, an
    attribute or a subscript (both can be properties or ``__getitem__``), an unpacking (it
    iterates), an expression statement (IPython displays its value), a comprehension.

    >>> runs_nothing("lr = 3e-4\nsizes = (n, 2)"), runs_nothing("y = x * 2")
    (True, False)
    """
    tree = _parsed(source)
    return tree is not None and all(isinstance(s, ast.Pass) or (isinstance(s, ast.Assign) and _literal_or_name(s.value)
                                           and all(isinstance(t, ast.Name) for t in s.targets))
               for s in tree.body)


def _literal_or_name(node) -> bool:
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(_literal_or_name(e) for e in node.elts)
    if isinstance(node, ast.UnaryOp):  # -1: folded into a constant when compiled
        return isinstance(node.operand, ast.Constant)
    return isinstance(node, (ast.Constant, ast.Name))


@functools.lru_cache(maxsize=256)
def with_body_names(filename: str, lineno: int) -> frozenset | None:
    """Inputs of the `with` block starting at `lineno` of `filename` (None without source)."""
    lines = linecache.getlines(filename)
    if not lines:
        return None
    try:
        tree = ast.parse("".join(lines))
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, (ast.With, ast.AsyncWith)) and node.lineno <= lineno <= node.body[0].lineno:
            return names_read("\n".join(ast.unparse(n) for n in node.body))
    return None
