"""The docs: their Python code runs as written, their links and paths stay inside the
repository, no placeholder is left, the API reference has whole docstrings, the README's
sequence-parallel figures are the measured ones, and every claim has its source."""

import importlib.util
import pathlib
import re

import pytest

from attnjax.experiment.claims import CLAIMS

ROOT = pathlib.Path(__file__).parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]
CODE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def prose(text: str) -> str:
    """``text`` without its fenced code blocks and code spans."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"(`+).+?\1", "", text)


def anchors(page: pathlib.Path) -> set[str]:
    """The ``#fragment`` targets of a page: explicit ids and GitHub's heading slugs."""
    text = page.read_text()
    ids = set(re.findall(r'<a id="([^"]+)"', text))
    for heading in re.findall(r"^#+ (.+)$", prose(text), re.M):
        ids.add(re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-"))
    return ids


@pytest.mark.parametrize(
    "page", [p for p in DOCS if CODE.search(p.read_text())], ids=lambda p: p.name
)
def test_python_blocks_run_as_written(page):
    """A page's ``python`` blocks run in order in one namespace, as a reader runs them (the
    README's are run by tests/test_readme.py); a block not meant to run has a plain fence."""
    namespace, blocks = {}, CODE.findall(page.read_text())
    assert blocks
    for i, block in enumerate(blocks):
        defined = set(namespace)
        exec(compile(block, str(page), "exec"), namespace)
        assert set(namespace) - defined, f"{page.name}: block {i} ran but defined nothing"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_and_paths_stay_in_the_repository(page):
    text = page.read_text()
    for target in re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", prose(text)):
        if re.match(r"[a-z]+:", target):  # https: and the like
            continue
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        assert resolved.is_relative_to(ROOT) and resolved.exists(), f"{page.name}: {target}"
        if fragment and resolved.suffix == ".md":
            assert fragment in anchors(resolved), f"{page.name}: {target}"
    for path in re.findall(r"(?:\.\./)+[\w./-]*", text):  # also in code: `../x/y.md`
        resolved = (page.parent / path).resolve()
        assert resolved.is_relative_to(ROOT) and resolved.exists(), f"{page.name}: {path}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_placeholder_is_left(page):
    leftover = re.findall(r"\b[A-Z]{2,}(?:_[A-Z0-9]{2,})+\b|\b(?:TODO|TBD|FIXME|XXX)\b",
                          prose(page.read_text()))  # fmt: skip
    assert not leftover, f"{page.name}: {leftover}"


def test_api_reference_gives_whole_first_paragraphs():
    spec = importlib.util.spec_from_file_location("api", ROOT / "docs" / "api.py")
    api = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(api)
    reference = api.PATH.read_text()
    assert reference == api.render()  # up to date
    entries = re.findall(r"^- (?:class )?`.+?`: (.*)$", reference, re.M)
    assert len(entries) > 100
    cut = [e for e in entries if e and not re.search(r"[.!?:)]$", e)]
    assert not cut, cut


def markdown_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")]
            for line in text.splitlines() if line.startswith("| ")]  # fmt: skip


def test_readme_sequence_parallel_memory_is_the_measured_one():
    """The README's table is docs/performance.md's causal measurement, P = 1, 2, 4, 8."""
    performance = (ROOT / "docs" / "performance.md").read_text()
    causal = performance.split("Causal (zigzag layout):")[1].split("No mask")[0]
    measured = {tuple(r[:3]): r[3:5] for r in markdown_rows(causal)}
    readme = (ROOT / "README.md").read_text()
    section = readme.split("**Sequence-parallel memory**")[1].split("## ")[0]
    rows = [r for r in markdown_rows(section) if r[0] != "strategy, pass"]
    assert len(rows) == 4
    for name, *per_device, ratio in rows:
        strategy, step = name.split(", ")
        assert per_device == [measured[strategy, step, p][0] for p in ("1", "2", "4", "8")]
        assert ratio == measured[strategy, step, "8"][1]
    one = [measured["chunked, one device", step, "1"][0] for step in ("fwd", "fwd+bwd")]
    assert f"{one[0]} MiB (forward) and {one[1]} MiB (forward+backward)" in section


def test_every_claim_has_its_source():
    sources = (ROOT / "docs" / "sources.md").read_text()
    sections = dict(re.findall(r"^### (\w+) — .*?\n(.*?)(?=^##|\Z)", sources, re.S | re.M))
    assert list(sections) == [c.id for c in CLAIMS]
    for claim in CLAIMS:
        section = sections[claim.id]
        for part in ("**Claim.**", "**Source.**", "**Published / expected.**"):
            assert part in section, (claim.id, part)
        assert re.findall(r"\(claims\.md#(\w+)\)", section) == list(claim.experiments)
