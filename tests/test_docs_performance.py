"""docs/performance.md is the page that says what jaxcoll is faster at: the README links it, it compares with XLA,
gloo and NCCL/MSCCL++, every setting says its machine, date, command and spread, and every link of the README and
docs/ reaches a file and a heading that exist (the record is reorganised by topic; links into it must follow)."""

import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_links_the_performance_page():
    assert "](docs/performance.md)" in (REPO / "README.md").read_text()


def test_every_setting_names_machine_date_command_and_spread():
    settings = {h: body for h, body in sections((DOCS / "performance.md").read_text()).items()
                if "against" in h.lower()}
    assert len(settings) == 4, list(settings)
    for heading, body in settings.items():
        for word in ("Machine", "Date", "Command"):
            assert f"**{word}" in body, (heading, word)
        assert re.search(r"\d\.\d+-\d+\.?\d*", body) or "deterministic" in body, (heading, "no spread")


def test_the_page_compares_with_xla_gloo_and_nccl_and_says_what_is_slower():
    text = (DOCS / "performance.md").read_text()
    for baseline in ("XLA", "gloo", "NCCL", "MSCCL++", "simulated"):
        assert baseline in text, baseline
    assert "Slower than XLA today, and why" in sections(text)


@pytest.mark.parametrize("page", ["README.md", *sorted(p.name for p in DOCS.glob("*.md"))])
def test_links_reach_files_and_headings_that_exist(page):
    here = REPO if page == "README.md" else DOCS
    text = (here / page).read_text()
    for target in LINK.findall(text):
        if target.startswith(("http", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        file = (here / path) if path else here / page
        assert file.exists(), target
        if anchor and file.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", file.read_text(), flags=re.M)
            assert anchor in {slug(h) for h in headings}, target
