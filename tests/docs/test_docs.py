"""The README and the documentation site point only at what exists (mkdocs --strict checks the site's own links)."""

import functools
import re
import subprocess
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


ARCHITECTURE = ROOT / "docs" / "architecture.md"


def architecture_tree(text: str) -> list[str]:
    """The paths the architecture page's tree names, from its indentation (two spaces a level; a name ending in ``/``
    is a folder, a line that starts with spaces only continues the line above)."""
    block = text.split("```")[1]
    paths, parents = [], []
    for line in block.splitlines():
        name = line.strip().split(" ")[0] if line.strip() else ""
        if not name.endswith(("/", ".py")):
            continue
        depth = (len(line) - len(line.lstrip())) // 2
        parents = parents[:depth] + [name]
        paths.append("".join(parents))
    return paths


def test_the_architecture_tree_is_parsed_by_indentation():
    tree = "```\npkg/      the package\n  a.py    a\n  sub/    sub\n    b.py  b\n            more about b\n  c.py\n```"
    assert architecture_tree(tree) == ["pkg/", "pkg/a.py", "pkg/sub/", "pkg/sub/b.py", "pkg/c.py"]


def test_the_architecture_page_names_every_module_and_only_what_exists():
    named = set(architecture_tree(ARCHITECTURE.read_text(encoding="utf-8")))
    assert sorted(p for p in named if not (ROOT / p).exists()) == []
    assert sorted(package_modules() - named) == []


def package_modules() -> set[str]:
    """Every module of both packages, but those inside a task family's folder (a family is one line of the tree)."""
    modules = set()
    for package in ("agentrl_verl", "env_adapters"):
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).parts
            if path.name != "__init__.py" and not (parts[:2] == ("env_adapters", "tasks") and len(parts) > 3):
                modules.add("/".join(parts))
    return modules


DOTTED = re.compile(r"`((?:agentrl_verl|env_adapters|bench)(?:\.\w+)+)`")
FILE_NAME = re.compile(r"`([\w-]+\.(?:py|yaml))`")


def resolves(dotted: str) -> bool:
    """Whether a dotted name is a module of the repository, or a name defined at the top of one (a class, function
    or constant; one attribute of it, e.g. a method, is taken on trust)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:cut])
        module = base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py"
        if module.exists():
            rest = parts[cut:]
            if not rest:
                return True
            defined = re.search(rf"^(?:class |def |async def )?{re.escape(rest[0])}\b", module.read_text(), re.M)
            return defined is not None and len(rest) <= 2
    return False


def test_dotted_names_are_resolved():
    assert resolves("agentrl_verl.pipeline.launch") and resolves("agentrl_verl.pipeline.launch.run_main_ppo")
    assert resolves("agentrl_verl.pipeline.launch.RLRun.wait")
    assert not resolves("agentrl_verl.pipeline.nothing") and not resolves("agentrl_verl.pipeline.launch.nothing")


@functools.cache
def repository_file_names() -> frozenset[str]:
    """The names of the files git tracks (a page may name one without its folder)."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return frozenset(Path(line).name for line in tracked.splitlines())


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_and_file_name_exists(page):
    """Dotted names of the packages resolve, and a file named by itself (``demo.py``) exists somewhere."""
    text = page.read_text(encoding="utf-8")
    missing = sorted(name for name in set(DOTTED.findall(text)) if not resolves(name))
    missing += sorted(name for name in set(FILE_NAME.findall(text)) if name not in repository_file_names())
    assert missing == [], f"{page.relative_to(ROOT)} names what does not exist: {missing}"
