"""docs/ARCHITECTURE.md against the code: its folder map is the modules as they are (generated
from the tree: ``python tests/project/test_architecture.py`` prints the block to paste), and the walk of
one setting from the dashboard to the step names functions that exist where it says.
"""
import pathlib
import re
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
PACKAGE = ROOT / "tunekit"


def folder_map() -> str:
    """Every module of tunekit/ by folder (package __init__ files and the façade left out)."""
    folders: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "__init__.py" or path.parent == PACKAGE:
            continue
        folders.setdefault(str(path.parent.relative_to(PACKAGE)) + "/", []).append(path.stem)
    lines = []
    for folder, modules in sorted(folders.items()):
        wrapped = textwrap.wrap(" ".join(modules), 80)
        lines.append(f"{folder:<18}{wrapped[0]}")
        lines += [" " * 18 + more for more in wrapped[1:]]
    return "\n".join(lines)


def _section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def test_the_folder_map_is_the_tree():
    block = re.search(r"```\n(.*?)\n```", _section("Folder map"), re.S).group(1)
    assert block == folder_map(), ("docs/ARCHITECTURE.md's folder map is not the tree: paste the output of "
                                   "`python tests/project/test_architecture.py`")


def test_the_walk_of_one_setting_names_what_exists():
    """Each step of the walk is `path/module.py` `name`: the module exists and defines the name."""
    steps = re.findall(r"`(tunekit/[\w/]+\.py)` `(\w+)`", _section("One setting, from the dashboard to the step"))
    assert len(steps) >= 5, steps
    for path, name in steps:
        source = (ROOT / path).read_text()
        assert re.search(rf"(def|class) {name}\b|^{name} = ", source, re.M), f"{path} defines no {name}"


if __name__ == "__main__":
    print(folder_map())
