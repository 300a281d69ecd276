"""``bench.demo_seeds`` without running the demo: fake seed folders (``summary.json`` and ``trajectories.jsonl`` of
known outcomes), the pooled statistics and report, and which folders are reused, refused or run."""

import json
import math
import sys
from pathlib import Path

import pytest

from agentrl_verl.pipeline.evaluation import held_out_changes
from agentrl_verl.pipeline.settings import load_pipeline_config
from agentrl_verl.presets import CONFIG_DIR
from agentrl_verl.tools.evaluate import EvalResult
from bench import common, demo_seeds
from bench.demo_seeds import (
    MODES,
    describe,
    expected_config,
    headline,
    parse_args,
    pending_seed,
    run_seeds,
    seed_record,
    seed_statistics,
    summary_markdown,
)

MULTITASK = str(Path(CONFIG_DIR) / "demo_multitask.yaml")
FAMILIES = ("calc", "kg", "webshop", "alfworld")
HELD_OUT = 4

# Per seed and family, greedy then sampled: (indices fail -> success, success -> fail, success both times) of
# HELD_OUT indices.
FLIPS = {
    0: {"calc": ((2, 0, 1), (1, 1, 0)), "kg": ((1, 0, 0), (0, 1, 0)), "webshop": ((1, 0, 0), (0, 0, 2)),
        "alfworld": ((0, 1, 1), (0, 0, 0))},
    1: {"calc": ((3, 0, 0), (2, 0, 0)), "kg": ((1, 0, 0), (1, 0, 0)), "webshop": ((1, 0, 0), (1, 0, 0)),
        "alfworld": ((1, 0, 0), (0, 2, 0))},
    2: {"calc": ((0, 1, 0), (1, 0, 0)), "kg": ((0, 0, 0), (0, 0, 0)), "webshop": ((0, 0, 0), (0, 0, 0)),
        "alfworld": ((0, 0, 0), (0, 0, 0))},
}


def _results(flips: dict, side: int) -> dict[str, dict[str, EvalResult]]:
    """The evaluation before (side 0) or after (side 1) RL of one seed's :data:`FLIPS`."""
    results = {}
    for mode in MODES:
        results[mode] = {}
        for family, per_mode in flips.items():
            up, down, both = per_mode[MODES.index(mode)]
            before = [False] * up + [True] * (down + both)
            after = [True] * up + [False] * down + [True] * both
            successes = (before, after)[side] + [False] * (HELD_OUT - up - down - both)
            results[mode][family] = EvalResult(family, mode, [
                {"task": family, "index": i, "status": "completed" if ok else "task limit reached",
                 "reward": float(ok), "success": ok, "turns": 2, "text": ""} for i, ok in enumerate(successes)])
    return results


def write_run(folder: Path, seed: int, status: str = "finished", overrides: tuple[str, ...] = ()) -> Path:
    """A demo run of seed ``seed`` (:data:`FLIPS`) in ``folder``, as the demo writes it, made with ``overrides``."""
    folder.mkdir(parents=True, exist_ok=True)
    before, after = _results(FLIPS[seed], 0), _results(FLIPS[seed], 1)
    finished = status == "finished"
    with open(folder / "trajectories.jsonl", "w") as f:
        for phase, results in (("before_rl", before), ("after_rl", after if finished else {})):
            for mode, per_task in results.items():
                for result in per_task.values():
                    for episode in result.episodes:
                        f.write(json.dumps({"phase": phase, "eval": mode, **episode}) + "\n")
    summary = {"status": status, "stopped_because": None if finished else "interrupted (Ctrl-C)",
               "tasks": held_out_changes(before, after if finished else None, learnable=list(FAMILIES)),
               "timings_s": {"total_s": 800.0 + seed}, "config": expected_config(MULTITASK, list(overrides), seed)}
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def _records(root: Path) -> list[dict]:
    return [seed_record(seed, folder, json.loads((folder / "summary.json").read_text()))
            for seed, folder in ((s, write_run(root / f"seed_{s}", s)) for s in FLIPS)]


def test_statistics_pool_the_seeds_per_family_and_mode(tmp_path):
    records = _records(tmp_path)
    assert records[0]["tasks"]["calc"] == {"held_out": 4,
                                           "greedy": {"before": 0.25, "after": 0.75, "change": 0.5, "up": 2, "down": 0},
                                           "sampled": {"before": 0.25, "after": 0.25, "change": 0.0, "up": 1,
                                                       "down": 1}}
    stats = seed_statistics(records)
    assert stats["seeds"] == [0, 1, 2] and stats["families"] == list(FAMILIES) and stats["modes"] == list(MODES)
    calc = stats["pooled"]["calc"]["greedy"]  # changes +0.50, +0.75, -0.25
    assert calc["episodes"] == 12 and (calc["up"], calc["down"]) == (5, 1) and calc["p"] == pytest.approx(7 / 64)
    assert calc["before"] == pytest.approx(1 / 6) and calc["after"] == pytest.approx(0.5)
    assert calc["change"] == pytest.approx((1 / 3, math.sqrt((0.5 ** 2 + 0.75 ** 2 + 0.25 ** 2 - 3 * (1 / 3) ** 2)
                                                             / 2 / 3)))
    alfworld = stats["pooled"]["alfworld"]["sampled"]  # changes 0, -0.5, 0
    assert (alfworld["up"], alfworld["down"], alfworld["p"]) == (0, 2, 1.0) and alfworld["change"][0] == -0.5 / 3
    assert stats["rose"]["greedy"] == {0: ["calc", "kg", "webshop"], 1: list(FAMILIES), 2: []}
    assert stats["rose"]["sampled"] == {0: [], 1: ["calc", "kg", "webshop"], 2: ["calc"]}
    assert stats["seeds_up"] == {"greedy": 2, "sampled": 1}


def test_report_states_the_episodes_and_ends_with_key_values(tmp_path):
    records = _records(tmp_path)
    stats = seed_statistics(records)
    text = summary_markdown(records, stats, "Settings.")
    assert "| calc | greedy | 12 | 0.167 | 0.500 | +0.333 +- 0.300 | 5 / 1 | 0.109 |" in text
    assert "| 0 | 800 | 3/4 (calc, kg, webshop) | 0/4 (-) |" in text
    assert "Seeds with at least 3 of 4 families up: greedy 2/3, sampled 1/3." in text
    assert "| 2 | calc | 4 | 0.250 -> 0.000 (-0.250; 0 up, 1 down) | 0.000 -> 0.250 (+0.250; 1 up, 0 down) |" in text
    line = headline(stats)
    assert line.startswith("calc_greedy_change=0.333 calc_greedy_se=0.300 calc_greedy_p=0.109 calc_sampled_change=")
    assert line.endswith(" seeds=3 seeds_3_up_greedy=2 seeds_3_up_sampled=1")
    assert " kg_sampled_change=0.000 kg_sampled_se=0.144 kg_sampled_p=0.75 " in line  # 1 up, 1 down


def test_only_modes_and_families_every_seed_has_are_pooled(tmp_path):
    records = _records(tmp_path)
    del records[1]["tasks"]["alfworld"]
    for family in FAMILIES:
        records[2]["tasks"][family].pop("sampled", None)
    stats = seed_statistics(records)
    assert stats["families"] == ["calc", "kg", "webshop"] and stats["modes"] == ["greedy"]
    assert headline(stats).endswith("seeds=3 seeds_3_up_greedy=2")


class _FakeDemo:
    """``subprocess.Popen`` of the demo (as :func:`bench.common.run_processes` starts it): writes the run its
    command asks for (``FLIPS``) and its result line to its log, or fails."""

    commands: list = []
    returncode_of_next = 0

    def __init__(self, cmd, stdout, **kwargs):
        self.commands.append(cmd)
        self.pid, self.returncode = -1, self.returncode_of_next
        sets = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--set"]
        if self.returncode == 0:
            write_run(Path(cmd[cmd.index("--output-dir") + 1]), int(sets[0].removeprefix("seed=")),
                      overrides=tuple(sets[2:]))
            stdout.write("calc_greedy_before=0.250 total_s=801\n")

    def poll(self):
        return self.returncode


@pytest.fixture
def fake_demo(monkeypatch):
    _FakeDemo.commands, _FakeDemo.returncode_of_next = [], 0
    monkeypatch.setattr(common.subprocess, "Popen", _FakeDemo)
    monkeypatch.setattr(common.time, "sleep", lambda seconds: None)
    return _FakeDemo


def test_a_missing_seed_runs_the_demo_into_its_folder(tmp_path, fake_demo, caplog):
    args = parse_args(["--config", MULTITASK, "--out", str(tmp_path), "--seeds", "1", "--set", "rl.steps=3"])
    folder = tmp_path / "seed_1"
    with caplog.at_level("INFO", logger="bench.demo_seeds"):
        summary = run_seeds(args, tmp_path)[1]
    assert fake_demo.commands == [[sys.executable, "-m", "agentrl_verl.tools.cli", "demo", "--config", MULTITASK,
                                   "--set", "seed=1", "--set", "warmup.seed=1", "--set", "rl.steps=3",
                                   "--output-dir", str(folder)]]
    assert summary["status"] == "finished" and summary["config"]["rl"]["steps"] == 3
    assert "seed 1: finished in" in caplog.text
    assert "calc_greedy_before=0.250 total_s=801" in (folder / "demo.log").read_text()  # the demo's output
    assert run_seeds(args, tmp_path) == {1: summary} and len(fake_demo.commands) == 1  # finished: reused


def test_seeds_run_in_parallel_on_their_own_cpus(tmp_path, fake_demo, monkeypatch):
    affinities = []
    monkeypatch.setattr(common.os, "sched_setaffinity",
                        lambda pid, cpus: affinities.append(set(cpus)))
    monkeypatch.setattr(common.os, "sched_getaffinity", lambda pid: set(range(8)))
    write_run(tmp_path / "seed_0", 0)
    args = parse_args(["--config", MULTITASK, "--out", str(tmp_path), "--seeds", "2", "0", "1", "--parallel", "2",
                       "--pin"])
    summaries = run_seeds(args, tmp_path)
    assert list(summaries) == [2, 0, 1] and all(s["status"] == "finished" for s in summaries.values())
    assert len(fake_demo.commands) == 2  # seed 0 was there
    # Each new run on a share of its own (set, then the caller's CPUs back).
    assert affinities == [{0, 1, 2, 3}, set(range(8)), {4, 5, 6, 7}, set(range(8))]


def test_a_run_of_other_settings_is_refused(tmp_path, fake_demo):
    folder = write_run(tmp_path / "seed_0", 0, overrides=("tasks.0.held_out=20",))
    args = parse_args(["--config", MULTITASK, "--out", str(tmp_path)])
    with pytest.raises(ValueError, match=r"seed_0 holds a demo run made with other settings \(tasks.0.held_out "):
        pending_seed(args, 0, folder)
    with pytest.raises(ValueError, match="other settings"):  # --report too
        demo_seeds.main(["--config", MULTITASK, "--out", str(tmp_path), "--seeds", "0", "--report"])
    assert fake_demo.commands == []


def test_a_run_made_before_a_setting_existed_counts_as_made_at_its_default(tmp_path, fake_demo):
    folder = write_run(tmp_path / "seed_0", 0)
    summary = json.loads((folder / "summary.json").read_text())
    del summary["config"]["warmup"]["device"]  # a run from before warmup.device
    del summary["config"]["warmup"]["reuse"]  # and before warmup.reuse
    (folder / "summary.json").write_text(json.dumps(summary))
    args = parse_args(["--config", MULTITASK, "--out", str(tmp_path)])
    assert pending_seed(args, 0, folder)["status"] == "finished"
    with pytest.raises(ValueError, match=r"other settings \(warmup.device differ"):
        pending_seed(parse_args(["--config", MULTITASK, "--out", str(tmp_path), "--set", "warmup.device=cpu"]), 0,
                     folder)


def test_a_stopped_run_is_run_again_and_unknown_files_are_refused(tmp_path, fake_demo):
    args = parse_args(["--config", MULTITASK, "--out", str(tmp_path)])
    stopped = write_run(tmp_path / "seed_2", 2, status="stopped")
    assert pending_seed(args, 2, stopped) is None and list(stopped.iterdir()) == []  # removed, ready for a new run
    busy = tmp_path / "seed_0"
    (busy / "env_logs").mkdir(parents=True)  # a run still going
    (busy / "demo.log").write_text("")
    with pytest.raises(ValueError, match="holds files but no demo summary"):
        pending_seed(args, 0, busy)
    with pytest.raises(ValueError, match="holds files but no demo summary"):  # before any run starts
        demo_seeds.main(["--config", MULTITASK, "--out", str(tmp_path), "--seeds", "2", "0"])
    assert fake_demo.commands == []


def test_a_failed_demo_is_named_with_its_log_after_the_others_end(tmp_path, fake_demo):
    fake_demo.returncode_of_next = 3
    with pytest.raises(RuntimeError, match=r"the demo failed for seed 0 \(see .*seed_0/demo.log\); seed 1 "):
        demo_seeds.main(["--config", MULTITASK, "--out", str(tmp_path), "--seeds", "0", "1"])
    assert len(fake_demo.commands) == 2
    fake_demo.returncode_of_next = 0  # the folders hold only the failed runs' logs: the same command runs them again
    assert demo_seeds.main(["--config", MULTITASK, "--out", str(tmp_path), "--seeds", "0", "1"]) == 0
    assert len(fake_demo.commands) == 4


def test_main_runs_what_is_missing_then_reports(tmp_path, fake_demo, capsys):
    write_run(tmp_path / "seed_0", 0)
    assert demo_seeds.main(["--config", MULTITASK, "--out", str(tmp_path), "--seeds", "0", "1", "2"]) == 0
    assert [cmd[cmd.index("--output-dir") + 1] for cmd in fake_demo.commands] == [
        str(tmp_path / "seed_1"), str(tmp_path / "seed_2")]
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.endswith("seeds=3 seeds_3_up_greedy=2 seeds_3_up_sampled=1")
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["stats"]["seeds"] == [0, 1, 2] and [r["seed"] for r in saved["runs"]] == [0, 1, 2]
    assert "50 held-out indices per family before and after 20 RL steps" in (tmp_path / "summary.md").read_text()


def test_report_summarises_the_finished_seeds_only_and_runs_nothing(tmp_path, fake_demo, capsys):
    write_run(tmp_path / "seed_0", 0)
    write_run(tmp_path / "seed_1", 1, status="stopped")
    assert demo_seeds.main(["--config", MULTITASK, "--out", str(tmp_path), "--seeds", "0", "1", "2", "--report"]) == 0
    assert fake_demo.commands == []
    assert capsys.readouterr().out.splitlines()[-1].endswith("seeds=1 seeds_3_up_greedy=1 seeds_3_up_sampled=0")
    with pytest.raises(SystemExit, match="no finished demo run"):
        demo_seeds.main(["--config", MULTITASK, "--out", str(tmp_path), "--seeds", "1", "2", "--report"])


def test_seeds_are_the_benchs_to_set():
    with pytest.raises(SystemExit):
        parse_args(["--out", "x", "--set", "warmup.seed=3"])
    with pytest.raises(SystemExit):
        parse_args(["--out", "x", "--seeds", "1", "1"])
    assert parse_args(["--out", "x"]).config == MULTITASK


def test_the_settings_sentence_names_the_shared_overrides():
    config = load_pipeline_config(MULTITASK, ["rl.steps=3"])
    sentence = describe(config, MULTITASK, ["rl.steps=3"])
    assert sentence.startswith("Settings demo_multitask.yaml with `--set rl.steps=3` (calc, kg, webshop, alfworld)")
    assert "before and after 3 RL steps" in sentence
    assert " with `" not in describe(config, MULTITASK)
