"""OS-interaction data loading (upstream format), checker scripts and tool-reply formatting (no Docker)."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import resources

import pytest

from env_adapters.sandbox.shell import CommandResult
from env_adapters.tasks.os_interaction import EMPTY_OUTPUT, TRUNCATION_NOTE, OSTask, format_output
from env_adapters.tasks.os_interaction.items import Script, load_items, load_sources, load_split, parse_item

CHECKS = resources.files("env_adapters.tasks.os_interaction") / "scripts" / "check"


def test_vendored_splits_load_with_every_shape_normalised():
    dev, train = load_split("dev"), load_split("train")
    assert (len(dev), len(train)) == (26, 1000)
    assert {item.flavour for item in dev + train} == {"default"}
    # dev[10] has a stray list as `create`: default container, no init; its check chain still works.
    assert dev[10].init == () and dev[10].checks[0] is None and "argv" in dev[10].checks[1].code
    # The calc items are checked by a script (our check/0.sh) and have a reference solution (example/0.sh).
    assert "calc" in dev[3].checks[0].code and dev[3].checks[0].language == "bash"
    assert "/usr/local/bin/calc" in dev[3].example.code
    assert "/usr/stock.log" in dev[25].init[0].code  # {"file": "init/stock-log.sh"}
    assert dev[21].init[0].code.startswith("echo 123>/root/.tmp")  # init given as a plain string
    assert dev[0].match == "1" and dev[0].start.startswith("python3 -c")
    assert dev[24].match == "Awesome-AgentBench"  # `example` beside `evaluation`, unused for match items
    string_match = (CHECKS / "string-match.py").read_text(encoding="utf-8")
    assert sum(Script(string_match, "python") in item.checks for item in train) == 47


def test_upstream_data_loads_from_a_file_or_folder_with_its_own_scripts(tmp_path):
    scripts = tmp_path / "scripts"
    (scripts / "init").mkdir(parents=True)
    (scripts / "init" / "setup.sh").write_text("echo prepared > /root/p\n")
    (scripts / "check").mkdir()
    (scripts / "check" / "1.sh").write_text('[ "$1" = yes ]\n')
    data = tmp_path / "data"
    data.mkdir()
    items = [{"description": "a", "create": {"image": "local-os/ubuntu", "init": {"file": "init/setup.sh"}},
              "evaluation": {"check": {"file": "check/1.sh"}}},
             {"description": "b", "evaluation": {"match": {"regex": "^4[0-9]$", "strip": False}}}]
    (data / "a.json").write_text(json.dumps(items))
    (data / "b.jsonl").write_text(json.dumps({"description": "c", "evaluation": {"match": "x"}}) + "\n")
    loaded = load_items(data, scripts)
    assert [item.description for item in loaded] == ["a", "b", "c"]
    assert loaded[0].flavour == "ubuntu" and loaded[0].init[0].code == "echo prepared > /root/p\n"
    assert loaded[0].checks == (Script('[ "$1" = yes ]\n'),)
    assert (loaded[1].regex, loaded[1].strip, loaded[2].match, loaded[2].strip) == ("^4[0-9]$", False, "x", True)
    assert load_items(data / "b.jsonl")[0].description == "c"  # scripts default: the data's folder
    # A reference to a missing file names the item and the path; nothing falls back to the vendored scripts.
    with pytest.raises(ValueError, match=r"a\.json\[0\].*init/setup\.sh.*does not exist"):
        load_items(data, tmp_path)
    with pytest.raises(ValueError, match="string-match.py.*does not exist"):
        parse_item({"description": "x", "evaluation": {"check": [None, {"language": "python",
                    "file": "check/string-match.py"}], "example": "ls"}}, "custom", tmp_path)
    with pytest.raises(ValueError, match="neither"):
        load_items(tmp_path / "missing.json")
    # The task takes such data as its `data` and `scripts` options instead of a vendored split.
    task = OSTask(data=str(data), scripts=str(scripts))
    assert task.indices() == [0, 1, 2] and task.items == loaded and task.scripts == scripts


def test_upstreams_folders_each_with_its_scripts_load_in_order(tmp_path):
    # Upstream's os-std: data/os_interaction/data/N/*.json, each folder's scripts in scripts/N/.
    for n in (1, 2):
        (tmp_path / "data" / str(n)).mkdir(parents=True)
        (tmp_path / "scripts" / str(n)).mkdir(parents=True)
        (tmp_path / "scripts" / str(n) / "check.sh").write_text(f"exit {n - 1}\n")
        for name in ("b", "a"):
            item = {"description": f"{n}{name}", "evaluation": {"check": {"file": "check.sh"}}}
            (tmp_path / "data" / str(n) / f"{name}.json").write_text(json.dumps([item]))
    sources = [{"problem_file": str(tmp_path / "data" / str(n) / "*.json"),
                "script_dir": str(tmp_path / "scripts" / str(n))} for n in (1, 2)]
    task = OSTask(data=sources)
    assert [item.description for item in task.items] == ["1a", "1b", "2a", "2b"]
    assert [item.checks[0].code for item in task.items] == ["exit 0\n"] * 2 + ["exit 1\n"] * 2
    assert task.scripts == tmp_path / "scripts" / "1"  # custom tasks resolve against the first entry's scripts
    with pytest.raises(ValueError, match="entry 1: '.*/data/3/\\*.json' matches no file"):
        load_sources([sources[0], {"problem_file": str(tmp_path / "data" / "3" / "*.json")}])
    with pytest.raises(ValueError, match="entry 0: .* is not {problem_file"):
        load_sources([{"problem_files": "x"}])
    with pytest.raises(ValueError, match="is empty"):
        OSTask(data=[])


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ({"description": "x", "evaluation": {}}, "needs 'match' or 'check'"),
        ({"description": "x", "create": {"local": "alpine"}, "evaluation": {"match": "1"}}, "unknown image flavour"),
        ({"description": "x", "evaluation": {"check": [None]}}, "needs evaluation.example"),
        ({"description": "x", "evaluation": {"check": {"file": "check/missing.sh"}}}, "no scripts folder"),
        ({"description": "x", "evaluation": {"check": {"code": "1", "language": "c"}}}, "unsupported script language"),
        ({"description": "x", "evaluation": {"match": 3}}, "must be a string"),
        ({"evaluation": {"match": "3"}}, "'description' string"),
    ],
)
def test_malformed_items_are_rejected_with_the_reason(raw, error):
    with pytest.raises(ValueError, match=error):
        parse_item(raw, "custom")


def check(name: str, answer: str, expected: str) -> bool:
    """Run the vendored checker ``name`` as upstream does (``python3 -c CODE ANSWER EXPECTED``)."""
    code = (CHECKS / f"{name}.py").read_text(encoding="utf-8")
    return subprocess.run([sys.executable, "-c", code, answer, expected], capture_output=True).returncode == 0


@pytest.mark.parametrize(("name", "answer", "expected", "ok"), [
    ("integer-match", " 42 ", "42\n", True), ("integer-match", "42", "43", False),
    ("integer-match", "4.0", "4", False), ("integer-match", "forty", "40", False),
    ("string-match", "a\r\nb", "a\nb\n", True), ("string-match", "installed", "not-yet", False),
    ("size-match", "4096", "4K\n", True), ("size-match", "1M", "1024K", True), ("size-match", "7Byte", "7", True),
    # Upstream's parser: integers only, the first suffix that matches wins ("4KB" ends with "B").
    ("size-match", "4096", "4.0K", False), ("size-match", "4KB", "4096", False), ("size-match", "4K", "8K", False),
    ("containing", "the answer is 42", "42", True), ("containing", "42", "the answer is 42", False),
    ("in", "42", "the answer is 42", True), ("in", "the answer is 42", "42", False),
])
def test_checker_scripts_behave_like_upstreams(name, answer, expected, ok):
    assert check(name, answer, expected) is ok


def test_format_output_truncates_and_explains_what_happened():
    long = CommandResult("x" * 5000, 0)
    text = format_output(long, 800, 30)
    assert len(text) == 800 and text.endswith(TRUNCATION_NOTE)
    assert format_output(CommandResult("", 0), 800, 30) == EMPTY_OUTPUT
    killed = format_output(CommandResult("partial\n", None, timed_out=True, restarted=True), 800, 30)
    assert killed.startswith("partial\n") and "longer than 30 s" in killed and "restarted" in killed
    # The shell kept more than it showed: still marked as truncated even if the kept part is short.
    assert format_output(CommandResult("y" * 10, None, flooded=True, truncated=True), 800, 30).count("truncated") == 1


def test_a_network_is_an_opt_in_that_is_said_out_loud(caplog):
    with caplog.at_level("WARNING", logger="env_adapters.tasks.os_interaction.task"):
        assert OSTask().limits.network == "none" and not caplog.records  # loopback only, silently
        assert OSTask(network="bridge").limits.network == "bridge"
    assert "'bridge'" in caplog.text and "reach the network" in caplog.text


async def test_a_host_without_a_docker_daemon_fails_setup_naming_the_placement_resource(monkeypatch, tmp_path):
    from env_adapters.task import TaskError

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-daemon.sock'}")  # nothing listens there
    task = OSTask()
    with pytest.raises(TaskError, match=r"no Docker daemon answers on this host .*--resources '\{\"docker\": 64\}'"):
        await task.setup()
    await task.teardown()
