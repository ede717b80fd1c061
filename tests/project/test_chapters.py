"""The chapter counts and the workshop table agree with the notebooks/ folder: README.md and
docs/chapters.md say how many chapters there are (02 onwards: 00_tour and 01_dashboard come
first), notebooks/README.md has one row per notebook, and its planned times add up."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
WORDS = {n: w for n, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve thirteen "
                                    "fourteen fifteen sixteen seventeen eighteen nineteen twenty".split())}


def _said(text: str) -> list[str]:
    """The counts said as '<word> chapters' (a line break may fall between the two)."""
    return re.findall(r"\b([a-z]+)\s+chapters\b", text)


def test_the_counts_in_words_are_the_folders():
    chapters = [n for n in NOTEBOOKS if int(n[:2]) >= 2]
    assert chapters[0] == "02_flops_mfu" and len(chapters) == len(NOTEBOOKS) - 2
    for doc in ("README.md", "docs/chapters.md"):
        said = [w for w in _said((ROOT / doc).read_text()) if w in WORDS.values()]
        assert said == [WORDS[len(chapters)]], (doc, said, len(chapters))


def _table() -> dict:
    """notebooks/README.md's timing table: notebook -> minutes."""
    rows = re.findall(r"^\| (\d\d) \| `(\d\d_\w+)` \| (\d+) min \|", (ROOT / "notebooks/README.md").read_text(), re.M)
    assert all(num == name[:2] for num, name, _ in rows)
    return {name: int(minutes) for _, name, minutes in rows}


def test_the_workshop_table_has_one_row_per_notebook_in_order():
    assert list(_table()) == NOTEBOOKS


def test_the_planned_times_add_up_to_the_tables():
    minutes = _table()
    text = (ROOT / "notebooks/README.md").read_text()
    spans = re.findall(r"(\d\d)–(\d\d): (?:(\d+) h )?(\d+) min", text)
    total = re.search(r"Plan on about (\d+) h (\d+) min for (\d\d)–(\d\d)", text)
    assert total and (total[3], total[4]) == (NOTEBOOKS[0][:2], NOTEBOOKS[-1][:2])
    assert int(total[1]) * 60 + int(total[2]) == sum(minutes.values())
    assert spans and [s[0] for s in spans][0] == NOTEBOOKS[0][:2] and spans[-1][1] == NOTEBOOKS[-1][:2]
    for first, last, hours, mins in spans:
        part = sum(m for n, m in minutes.items() if first <= n[:2] <= last)
        assert part == int(hours or 0) * 60 + int(mins), (first, last, part)
    covered = [n for n in minutes if any(a <= n[:2] <= b for a, b, _, _ in spans)]
    assert covered == list(minutes)      # the sessions cover every notebook


def test_a_missing_extra_in_a_chapter_names_its_pip_command():
    import pytest

    import tunekit

    with pytest.raises(ModuleNotFoundError) as info:
        with tunekit.core.needs_extra("chapter 16"):
            raise ModuleNotFoundError("No module named 'transformers'", name="transformers")   # what import says
    assert str(info.value) == "chapter 16 needs transformers, which is not installed: pip install 'tunekit[hf]'"
    with pytest.raises(ModuleNotFoundError, match="No module named 'numpy_x'"):   # no extra brings it: as is
        with tunekit.core.needs_extra("chapter 16"):
            raise ModuleNotFoundError("No module named 'numpy_x'", name="numpy_x")


def test_every_chapter_imports_an_extras_package_under_needs_extra():
    from tunekit.core.extras import EXTRAS

    optional = "|".join(sorted(EXTRAS)) + "|tunekit.integrations"
    for name in NOTEBOOKS:
        lines = (ROOT / "notebooks" / f"{name}.py").read_text().splitlines()
        for i, line in enumerate(lines):
            if re.match(rf"\s*(import|from) ({optional})\b", line):
                # inside the with block: indented, under a `with tunekit.core.needs_extra(...)` line
                opener = next(prev for prev in reversed(lines[:i]) if not prev.startswith((" ", "#")) and prev)
                assert line.startswith("    ") and opener.startswith("with tunekit.core.needs_extra("), (name, line)
