"""The layering is a contract: ``lint-imports`` checks the contracts in ``pyproject.toml`` (``[tool.importlinter]``):
the environment side never imports the training side, nothing imports the benches or the demo's command, and no two
modules of a package import each other, directly or through others."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


PRIVATE_IMPORT = re.compile(r"^\s*from (agentrl_verl|env_adapters|bench)[\w.]* import (.*)$", re.MULTILINE)


def private_imports(text: str) -> list[str]:
    """The names beginning with ``_`` that ``text`` imports from the project's packages (one-line imports and the
    lines of a parenthesised one)."""
    names = []
    for match in PRIVATE_IMPORT.finditer(text):
        imported = match.group(2)
        if imported.strip().startswith("("):  # the names follow on the next lines, up to the closing parenthesis
            imported = text[match.end():text.index(")", match.end())]
        names += [name.split(" as ")[0].strip() for name in imported.replace("(", "").split(",")]
    return [name for name in names if name.startswith("_")]


def test_private_imports_are_found():
    assert private_imports("from agentrl_verl.x import a, _b\nfrom env_adapters.y import (\n    c,\n    _d,\n)\n"
                           "from typing import _e\n") == ["_b", "_d"]


def test_benches_and_tests_use_public_names_only():
    files = [*(ROOT / "bench").glob("*.py"), *(ROOT / "tests").rglob("*.py")]
    found = {str(f.relative_to(ROOT)): names for f in files if (names := private_imports(f.read_text()))}
    assert found == {}
