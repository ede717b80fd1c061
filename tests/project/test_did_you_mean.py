"""Every did-you-mean suggestion has one form, made in one place (core.validate.did_you_mean):
": did you mean 'bf16'?" at the end of the clause that refuses, anything after it in parentheses.
Issue 39 found two forms: "unknown device 'H100X' (did you mean 'H100 SXM'?): one of ..." beside
"precision must be one of ...: did you mean 'bf16'?"."""
import ast
from pathlib import Path

import pytest

import tunekit
from tunekit.core import registry, specs
from tunekit.core.setting import Toggles, word_problems
from tunekit.core.validate import did_you_mean

PACKAGE = Path(tunekit.__file__).parent
HOME = PACKAGE / "core" / "validate.py"


def _said(tree) -> list:
    """The string constants of a module that are not docstrings (nor comments: ast has none)."""
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_no_module_but_its_home_writes_did_you_mean_itself():
    found = [f"{p.relative_to(PACKAGE)}:{n.lineno}" for p in sorted(PACKAGE.rglob("*.py")) if p != HOME
             for n in _said(ast.parse(p.read_text())) if "did you mean" in n.value.lower()]
    assert found == []


def test_the_one_form():
    assert did_you_mean("bf16") == ": did you mean 'bf16'?"
    assert did_you_mean("--steps", quote=False) == ": did you mean --steps?"
    assert did_you_mean(None) == did_you_mean("") == ""


@pytest.mark.parametrize("refuse, said", [
    (lambda: specs.card("H100X"), "unknown device 'H100X': did you mean 'H100 SXM'? (the devices: "),
    (lambda: registry.optimizer("adamq"), ": did you mean 'adamw'?"),
    (lambda: tunekit.GPTConfig.preset("cpu-tiyn"),
     "unknown preset 'cpu-tiyn': did you mean 'cpu-tiny'? (the presets: "),
])
def test_the_messages_that_suggest_say_it_the_same_way(refuse, said):
    with pytest.raises(ValueError) as info:
        refuse()
    assert said in str(info.value)


def test_a_refused_precision_ends_with_its_suggestion_as_the_others_do():
    # the reason in parentheses, the suggestion last: never "(did you mean 'bf16'?): the training precision"
    assert word_problems(Toggles(precision="bfloat16"))[0][0].endswith("dtype): did you mean 'bf16'?")
