"""The README and docs/ pages: every output they show as what the code prints is what it prints,
every relative link resolves, and the README stays a short front page.

Shown outputs are compared line by line, runs of blanks collapsed; ``...`` in a shown line
stands for text that depends on the machine (a path, a time, the backend).
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_BYTES = 6000  # a front page: the rest belongs in docs/ (issue 33)


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def _assert_shown(got: str, shown: str, where: str) -> None:
    """``got`` matches the ``shown`` block line by line (blanks collapsed, ``...`` a wildcard)."""
    got_lines = [" ".join(ln.split()) for ln in got.rstrip("\n").splitlines()]
    shown_lines = [" ".join(ln.split()) for ln in shown.rstrip("\n").splitlines()]
    assert len(got_lines) == len(shown_lines), f"{where}: printed\n{got}\nshown\n{shown}"
    for g, s in zip(got_lines, shown_lines, strict=True):
        pattern = ".*".join(re.escape(part) for part in s.split("..."))
        assert re.fullmatch(pattern, g), f"{where}: printed\n  {g}\nshown\n  {s}"


def _run(code: str, where: str, scope: dict | None = None) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, where, "exec"), {} if scope is None else scope)
    return out.getvalue()


def test_readme_is_a_short_front_page():
    text = README.read_text()
    assert len(text.encode()) <= README_MAX_BYTES, "README.md: move details to a docs/ page"
    # the quick form of verify is on the front page, right after the two commands
    assert "q2gemv verify --backend reference" in text[: text.index("## Install")]


def test_readme_example_prints_what_it_shows():
    text = README.read_text()
    example = text[text.index("## Example") :]
    (code, shown) = _blocks(example, "python")[0], _blocks(example, "text")[0]
    assert len(code.strip().splitlines()) <= 13  # the ~10-line example of the front page
    _assert_shown(_run(code, "README.md#example"), shown, "README.md example")


def test_kernels_page_explain_outputs_are_what_explain_prints(monkeypatch):
    for var in ("Q2GEMV_NO_GEMV_EXACT_M_TIERS", "ATLAS_NO_GEMV_EXACT_M_TIERS"):
        monkeypatch.delenv(var, raising=False)
    for var in ("Q2GEMV_NO_BATCH8_RT", "ATLAS_NO_BATCH8_RT"):
        monkeypatch.delenv(var, raising=False)
    from q2gemv.dispatch import nvfp4_tiers as tiers

    tiers.reload_env()
    try:
        text = (DOCS / "kernels.md").read_text()
        section = text[text.index("## W4A16 tier selection") :]
        codes, shown = _blocks(section, "python"), _blocks(section, "text")
        assert len(codes) == len(shown) == 2
        scope: dict = {}
        for i, (code, out) in enumerate(zip(codes, shown, strict=True)):
            _assert_shown(_run(code, f"docs/kernels.md#explain{i}", scope), out, "kernels.md")
    finally:
        tiers.reload_env()


def test_kernels_page_calling_block_runs():
    text = (DOCS / "kernels.md").read_text()
    _run(_blocks(text, "python")[0], "docs/kernels.md#calling")


def test_commands_page_verify_report_has_the_packaged_counts():
    """The shown ``q2gemv verify --backend reference`` report: its files, rows and counts are
    the packaged suite's (the host checks run, fast; every GEMV check is counted as passing:
    whether it passes is tests/golden/test_harness.py's job)."""
    from q2gemv.golden import harness, report, suite

    text = (DOCS / "commands.md").read_text()
    shown = next(b for b in _blocks(text, "text") if b.startswith("golden data:"))
    s = suite.load_suite()
    sel = suite.Selection.parse(None)
    run = report.BackendRun("reference", "NumPy (this process)")
    run.results = harness.run_host_cases(sel.host_cases(s)) + [
        report.CheckResult(c.id, k, "reference", "pass", size=c.size_of(k))
        for c, k in sel.gemv_checks(s)
    ]
    n = len(suite.expected_files())
    got = (
        f"golden data: {s.data_dir} (format v{s.manifest.get('format_version')}, generator "
        f"v{s.manifest.get('generator', {}).get('version')}): {n} files expected, {n} intact\n"
        + report.summary_text([run], [])
    )
    _assert_shown(got, shown, "docs/commands.md verify report")


def _links(path: Path) -> list[str]:
    return [
        t
        for t in re.findall(r"\]\(([^)\s]+)\)", path.read_text())
        if not re.match(r"[a-z]+:", t) and not t.startswith("#")
    ]


@pytest.mark.parametrize(
    "path", [README, *sorted(DOCS.glob("*.md"))], ids=lambda p: str(p.relative_to(ROOT))
)
def test_relative_links_resolve(path):
    bad = [t for t in _links(path) if not (path.parent / t.split("#")[0]).exists()]
    assert not bad, f"{path.name}: links to nothing: {bad}"
    # and every #anchor, of this page or of another .md, names one of its headings
    text = path.read_text()
    targets = [("", a) for a in re.findall(r"\]\(#([^)\s]+)\)", text)]
    targets += [tuple(t.split("#", 1)) for t in _links(path) if "#" in t]
    for page, anchor in targets:
        where = path.parent / page if page else path
        assert anchor in _anchors(where), f"{path.name}: no heading #{anchor} in {where.name}"


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a markdown page."""
    heads = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", path.read_text(), flags=re.S), re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


def test_readme_links_every_docs_page():
    linked = {(README.parent / t.split("#")[0]).resolve() for t in _links(README)}
    missing = [p.name for p in DOCS.glob("*.md") if p.resolve() not in linked]
    assert not missing, f"README.md links no {missing}"


def test_commands_page_simulator_notice_is_what_verify_prints(monkeypatch):
    import os

    from q2gemv.golden import harness, suite

    monkeypatch.setattr(os, "cpu_count", lambda: 2)  # the page's example machine
    text = (DOCS / "commands.md").read_text()
    shown = next(b for b in _blocks(text, "text") if "the cuda backend runs" in b)
    todo = harness.simulator_checks(suite.Selection.parse(None).gemv_checks(suite.load_suite()))
    _assert_shown(f"q2gemv verify: {harness.sim_notice(todo, 2)}", shown, "commands.md notice")


def test_architecture_doc_names_only_what_exists():
    import importlib

    text = (ROOT / "docs" / "architecture.md").read_text()
    pat = (
        r"\b((?:api|dispatch\.\w+|host\.\w+|reference\.\w+|io(?:\.\w+)+|nn\.\w+|formats\.\w+"
        r"|golden\.\w+|cuda(?:\.\w+)+)"
        r"\.(\w+))"
    )
    names = {m[0] for m in re.findall(pat, text) if m[1] != "py"}
    assert "api.gemv" in names
    for dotted in sorted(names):
        mod, _, attr = dotted.rpartition(".")
        parent = importlib.import_module("q2gemv." + mod)
        if not hasattr(parent, attr):  # a submodule: it must import
            importlib.import_module(f"q2gemv.{dotted}")
