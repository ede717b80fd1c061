"""Rules on the shape of the code that a reader relies on (issue 40, item 5), checked over the AST:

- one way to test for a missing number: ``tunekit.core.units.is_missing``; no ``x == x`` /
  ``x != x``, no ``math.isnan`` and no private twin of it anywhere else in tunekit/;
- no function over 80 lines unless its docstring says why, on a line starting ``long:``;
- one home for the dtype names: code writes ``registry.BF16`` (FP32, TF32, FP16, FP8), not the
  string, outside ``core/registry.py`` (docstrings, messages and f-strings may say "bf16");
- one home for "which IPython shell" (view/frontend.py) and for the FSDP half-param-dtype rule.
"""
import ast
import io
import pathlib
import tokenize

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2] / "tunekit"
HOME = ROOT / "core" / "units.py"  # is_missing lives here, the one place math.isnan is read
MAX_FUNCTION_LINES = 80
FILES = sorted(ROOT.rglob("*.py"))
# names a private twin of is_missing goes by (core/conditions.py had `_nan`)
NAN_NAMES = {"nan", "isnan", "is_nan", "not_nan", "notnan", "isnull", "is_null"}
# long functions another change is splitting (issue 40, item 1: the Setting at each entry); each must
# still be long, so the set only shrinks
PENDING_LONG: dict = {}


def other_missing_checks(source: str) -> list[str]:
    """Every self-comparison (``x == x``, ``x != x``), ``math.isnan``/``numpy.isnan`` and function
    named like a NaN test other than is_missing, as ``line N: code``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.Eq, ast.NotEq)) \
                and ast.dump(node.left) == ast.dump(node.comparators[0]):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Attribute) and node.attr == "isnan":
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.FunctionDef) and node.name.strip("_").lower() in NAN_NAMES:
            found.append(f"line {node.lineno}: def {node.name}")
    return sorted(found, key=lambda s: int(s.split()[1].rstrip(":")))


def test_the_other_missing_checks_are_caught():
    source = ("import math\nok = v == v\nbad = x != x\nm = math.isnan(y)\nn = np.isnan(z)\n"
              "def _nan(x): pass\nfine = a == b\n")
    assert other_missing_checks(source) == ["line 2: v == v", "line 3: x != x", "line 4: math.isnan",
                                            "line 5: np.isnan", "line 6: def _nan"]


@pytest.mark.parametrize("path", [p for p in FILES if p != HOME], ids=lambda p: str(p.relative_to(ROOT)))
def test_one_way_to_test_for_a_missing_number(path):
    found = other_missing_checks(path.read_text())
    assert found == [], f"{path.relative_to(ROOT)}: use tunekit.core.units.is_missing, not {found}"


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """Functions (methods, nested ones) over ``limit`` lines whose docstring gives no ``long:`` reason."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            doc = ast.get_docstring(node) or ""
            if n > limit and not any(line.strip().startswith("long:") for line in doc.splitlines()):
                out.append(f"{node.name} ({n} lines, line {node.lineno})")
    return out


def test_a_long_function_is_caught_unless_it_says_why():
    body = "".join(f"    x{i} = {i}\n" for i in range(80))
    assert long_functions(f"def f():\n{body}") == ["f (81 lines, line 1)"]  # def line + 80
    assert long_functions(f'def f():\n    """Sum.\n\n    long: one table, row by row."""\n{body}') == []
    assert long_functions(f"def f():\n{body[:-len('    x79 = 79')-1]}") == []  # 80 lines: allowed


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_function_over_80_lines_without_a_reason(path):
    rel = path.relative_to(ROOT).as_posix()
    long = {entry.split(" (")[0] for entry in long_functions(path.read_text())}
    assert long == PENDING_LONG.get(rel, set()), \
        f"{rel}: {sorted(long)} over {MAX_FUNCTION_LINES} lines: split it by what it does, or say why in its " \
        "docstring ('long: ...'); a pending one that got short leaves PENDING_LONG"


DTYPE_HOME = ROOT / "core" / "registry.py"
DTYPE_NAMES = {"fp32", "tf32", "bf16", "fp16", "fp8"}
# modules that still write a dtype name as a string; each must still do so, so the set only shrinks
PENDING_DTYPE_LITERALS = {
    "cli/doctor.py": "'bf16' there is the name of a check and a key of _cuda's answer, not a dtype",
}


def dtype_literals(source: str) -> list[str]:
    """Every string token that is exactly a dtype name (not an f-string, docstring or message)."""
    return [f"line {t.start[0]}: {t.string}" for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type == tokenize.STRING and t.string[:1] in "'\"" and t.string[1:-1] in DTYPE_NAMES
            and len(t.string) == len(t.string[1:-1]) + 2]


def test_dtype_literals_are_caught():
    source = 'a = "bf16"\nb = f"bf16"\nc = "bf16 or fp16"\n# "fp32"\nd = {\'fp8\': 1}\n'
    assert dtype_literals(source) == ['line 1: "bf16"', "line 5: 'fp8'"]


@pytest.mark.parametrize("path", [p for p in FILES if p != DTYPE_HOME], ids=lambda p: str(p.relative_to(ROOT)))
def test_dtype_names_have_one_home(path):
    rel = str(path.relative_to(ROOT))
    found = dtype_literals(path.read_text())
    if rel in PENDING_DTYPE_LITERALS:
        assert found, f"{rel} names no dtype by its string now: drop it from PENDING_DTYPE_LITERALS"
    else:
        assert found == [], f"{rel}: write tunekit.core.registry's BF16/FP16/FP32/TF32/FP8, not {found}"


def uses_of(name: str) -> list[str]:
    """Where tunekit's code (not its docstrings or comments) names ``name``: a call, an attribute or an
    import of it, as ``module.py:line``."""
    found = []
    for path in FILES:
        for node in ast.walk(ast.parse(path.read_text())):
            named = (isinstance(node, ast.Name) and node.id == name) or (
                isinstance(node, ast.Attribute) and node.attr == name) or (
                isinstance(node, ast.ImportFrom) and any(a.name == name for a in node.names))
            if named:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_which_ipython_shell_and_the_fsdp_param_dtype_rule_have_one_home_each():
    # "is there an IPython shell, of what kind": view/frontend.py reads get_ipython, nothing else does
    # (the dashboard, lab.dashboard, the progress views, Monitor and experiments each read it before)
    assert {u.split(":")[0] for u in uses_of("get_ipython")} == {"view/frontend.py"}
    # FSDP over fp32 weights under autocast computes on its half param dtype: applied in one method
    # (planner._Steps.on_param_dtype), which the plan's steps and the advice's placements both call
    assert [u.split(":")[0] for u in uses_of("in_param_dtype")] == ["planning/planner.py"] * 2   # import, call
