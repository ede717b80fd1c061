"""The docs site's structure, checked without building it (`make docs` builds it, with --strict).

Every page in mkdocs.yml's nav exists and every page and chapter notebook is in the nav; every
public name of tunekit has an API entry (``::: tunekit.NAME`` in docs/api/), and every entry names
a public name; every relative link in docs/ and in the README resolves, anchors included. The
pages' code blocks run in tests/project/test_readme.py.
"""
from __future__ import annotations

import os
import re
import unicodedata
from pathlib import Path

import pytest
import yaml

import tunekit

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CONFIG = yaml.safe_load((ROOT / "mkdocs.yml").read_text())


def nav_pages(nav) -> list[str]:
    """Every page path in a nav tree (entries are paths, {title: path} or {title: [entries]})."""
    out = []
    for entry in nav:
        if isinstance(entry, str):
            out.append(entry)
        else:
            for value in entry.values():
                out += nav_pages(value) if isinstance(value, list) else [value]
    return out


NAV = nav_pages(CONFIG["nav"])
PAGES = sorted(DOCS.glob("*.md")) + sorted((DOCS / "api").glob("*.md"))


def test_config_builds_into_build_site_strictly():
    assert CONFIG["docs_dir"] == "docs" and CONFIG["site_dir"] == "build/site" and CONFIG["strict"] is True


def test_every_nav_page_exists_and_every_page_is_in_the_nav():
    assert len(NAV) == len(set(NAV)), "a page listed twice"
    for page in NAV:
        assert (DOCS / page).is_file(), f"mkdocs.yml's nav names {page}, which docs/ lacks"
    pages = {p.relative_to(DOCS).as_posix() for p in PAGES}
    assert pages - set(NAV) == set(), "pages no nav entry reaches"
    # the chapters: docs/notebooks is the notebooks folder, every notebook a page
    assert (DOCS / "notebooks").resolve() == (ROOT / "notebooks").resolve()
    chapters = {f"notebooks/{p.name}" for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert len(chapters) >= 18 and chapters <= set(NAV), chapters - set(NAV)


def _api_entries() -> dict[str, str]:
    """``::: tunekit.NAME`` -> the API page it is on."""
    out = {}
    for page in sorted((DOCS / "api").glob("*.md")):
        for name in re.findall(r"^::: tunekit\.([\w.]+)\s*$", page.read_text(), re.M):
            assert name not in out, f"tunekit.{name} on {out[name]} and {page.name}"
            out[name] = page.name
    return out


def test_every_public_name_has_an_api_entry():
    entries = _api_entries()
    missing = set(tunekit.__all__) - set(entries)
    assert not missing, f"public names with no `::: tunekit.NAME` in docs/api/: {sorted(missing)}"
    # a name that left the top level is documented at its new home (tunekit.measure.median_s)
    homes = {f"{home.removeprefix('tunekit.')}.{name}" for name, home in tunekit.MOVED.items()}
    assert not homes - set(entries), f"moved names with no entry at their home: {sorted(homes - set(entries))}"
    # and each other entry is a public name, or a public class of an integrations module (the contract's
    # tunekit.integrations.transformers.TunekitCallback), so no page documents an internal path
    for name in set(entries) - set(tunekit.__all__) - homes:
        module, _, attr = name.rpartition(".")
        source = ROOT / "tunekit" / f"{module.replace('.', '/')}.py"
        assert module.startswith("integrations.") and source.is_file(), name
        assert re.search(rf"^class {attr}\b", source.read_text(), re.M), name
    # every API page is in the nav
    assert {f"api/{page}" for page in entries.values()} <= set(NAV)


# --- links -------------------------------------------------------------------------------------


def _strip_code(text: str) -> str:
    """The text without fenced blocks and inline code, where a ](x) is not a link."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """Python-Markdown's toc slug (MkDocs' default): what an #anchor must equal."""
    value = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode()
    value = re.sub(r"[^\w\s-]", "", value).strip().lower()
    return re.sub(r"[-\s]+", "-", value)


def anchors(path: Path) -> set:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    return {slug(h.replace("`", "")) for h in re.findall(r"^#{1,6} (.+?)\s*$", text, re.M)}


def links(path: Path) -> list[str]:
    return [m for m in re.findall(r"\]\(([^)\s]+)\)", _strip_code(path.read_text()))
            if not re.match(r"[a-z]+:", m)]   # http:, https:, mailto: are not the repository's


@pytest.mark.parametrize("page", PAGES + [ROOT / "README.md"], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page):
    root = ROOT if page.name == "README.md" and page.parent == ROOT else DOCS
    found = links(page)
    for link in found:
        target, _, anchor = link.partition("#")
        path = Path(os.path.normpath(page.parent / target)) if target else page
        assert path.exists(), f"{page.relative_to(ROOT)}: {link} does not exist"
        # the site holds only docs/ (docs/notebooks included): a link out of it breaks there
        assert path.is_relative_to(root), f"{page.relative_to(ROOT)}: {link} leaves {root.name}/"
        if anchor and path.suffix == ".md":
            assert anchor in anchors(path), f"{page.relative_to(ROOT)}: #{anchor} is no heading of {path.name}"
    if page.name in ("index.md", "README.md"):
        assert found, "the home pages link to the rest"


def test_slug_is_mkdocs_toc_slug():
    # Python-Markdown's toc.slugify: "This site" -> "this-site"; punctuation dropped, runs of - and
    # spaces one -; the backticks of a code heading are gone before it is slugged
    assert slug("This site") == "this-site"
    assert slug("Will it fit? Is it shaped well?") == "will-it-fit-is-it-shaped-well"
    assert slug("Your own loop: tunekit.Monitor") == "your-own-loop-tunekitmonitor"


def test_every_cuda_context_size_the_project_states_is_the_one_constant():
    """The docs, README, notebooks and package state the CUDA context's size as the figure an
    estimate and a plan charge (core.memory.options.CUDA_CONTEXT), never a copy that drifts."""
    from tunekit.core.memory.options import CUDA_CONTEXT

    said = f"{CUDA_CONTEXT[0] / 2**30:.2f} GiB"   # 0.47 * 2**30 bytes -> '0.47 GiB'
    files = [ROOT / "README.md", *PAGES, *sorted((ROOT / "notebooks").glob("*.py")),
             *sorted((ROOT / "tunekit").rglob("*.py"))]
    # a size the CUDA context is given: 'CUDA context (0.5 GiB)', 'CUDA context and kernels (0.5–2 GB',
    # '0.5-2 GB of CUDA context' (what these files said before they read the constant)
    n = r"\d[\d.]*(?:\s*[–-]\s*\d[\d.]*)?\s*[GM]i?B"
    sizes = [re.compile(r"CUDA context[^.;()]{0,60}\(\s*(" + n + ")"),
             re.compile("(" + n + r") of (?:the )?CUDA context")]
    stated = [(f.relative_to(ROOT).as_posix(), m.group(1)) for f in files for rx in sizes
              for m in rx.finditer(f.read_text(encoding="utf-8"))]
    assert [s for s in stated if s[1] != said] == []
    assert ("docs/memory.md", said) in stated   # the check reads what it guards
    before = "0.5-2 GB of CUDA context; the CUDA context\n# and kernels (0.5–2 GB, lazily"
    assert [m.group(1) for rx in sizes for m in rx.finditer(before)] == ["0.5–2 GB", "0.5-2 GB"]
