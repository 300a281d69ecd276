"""The README and the documentation site point only at what exists (mkdocs --strict checks the site's own links)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "recipes").rglob("*.md")])
TOP = ("agentrl_verl/", "env_adapters/", "bench/", "recipes/", "examples/", "scripts/", "tests/", "docs/")
PATH = re.compile(r"`([A-Za-z0-9_./-]+)`")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def repository_paths(text: str) -> set[str]:
    """The repository paths a page names in code spans: a file or a folder under one of the top-level folders."""
    return {match for match in PATH.findall(text) if match.startswith(TOP) and "/" in match.rstrip("/")}


def test_repository_paths_are_recognised():
    text = "see `bench/results/ablation/summary.md`, `agentrl-verl demo`, `docs/` and `x/y.py`"
    assert repository_paths(text) == {"bench/results/ablation/summary.md"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_and_relative_link_exists(page):
    text = page.read_text(encoding="utf-8")
    missing = sorted(path for path in repository_paths(text) if not (ROOT / path).exists())
    links = [link for link in LINK.findall(text) if "://" not in link]
    missing += sorted(link for link in links if not (page.parent / link).exists())
    assert missing == [], f"{page.relative_to(ROOT)} names what does not exist: {missing}"


BENCHES = sorted(p for p in (ROOT / "bench").glob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("bench", BENCHES, ids=lambda p: p.name)
def test_every_runnable_bench_links_the_page_of_its_results(bench):
    pages = [path for path in repository_paths(bench.read_text(encoding="utf-8")) if path.startswith("docs/")]
    assert pages and all((ROOT / page).exists() for page in pages), f"{bench.name} names no existing docs page"
