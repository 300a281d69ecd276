"""The parts of ``bench.async_vs_sync`` that need no verl: per-run summaries, pairing, statistics over seeds, the
report, and the bookkeeping that resumes a run that was cut off."""

import json
import math
import os
import subprocess
from pathlib import Path

import pytest

from bench import async_vs_sync, common
from bench.async_vs_sync import (
    CORRECTIONS,
    load_pairs,
    pair_done,
    pair_record,
    pair_settings,
    paired_statistics,
    parse_args,
    run_children,
    run_pair,
    start_held_out,
    summarise,
    summary_markdown,
    write_pair,
)
from bench.common import cpu_list, cpu_shares, mean_and_se, saved_record


def _run(step_s: list[float], calc_episodes: float, extra: dict | None = None) -> dict:
    steps = {}
    for i, seconds in enumerate(step_s, start=1):
        steps[i] = {"timing_s/step": seconds, "agentrl/all/episodes": 16.0, "agentrl/calc/episodes": calc_episodes,
                    "agentrl/all/reward": 0.1 * i, **(extra or {})}
    steps[len(step_s)]["timing_s/save_checkpoint"] = 1.0
    return {"wall_s": sum(step_s) + 30.0, "steps": steps, "model": "/m"}


def _pair(seed: int, sync: float, asynchronous: float, speedup: float = 3.0) -> dict:
    return {"seed": seed, "speedup": speedup, "speedup_after_step1": speedup + 0.5,
            "sync_train_s": 30.0 * speedup, "async_train_s": 30.0,
            "calc_trajectories": {"sync": 128.0, "async": 120.0},
            "held_out": {"sync": sync, "async": asynchronous}, "held_out_episodes": 200,
            "diagnostics": {"async": {"turn_lag_mean": 1.2, "multi_version": 0.4, "clipfrac": 0.05},
                            "sync": {"clipfrac": 0.0}}}


def test_summarise_leaves_out_the_final_save_and_averages_diagnostics():
    run = _run([4.0, 5.0, 6.0], calc_episodes=8.0,
               extra={"async/staleness/turn_lag/mean": 1.5, "async/staleness/turn_lag/max": 2.0,
                      "actor/rollout_corr/kl": 0.02})
    run["steps"][2]["async/staleness/turn_lag/max"] = 3.0
    summary = summarise(run)
    assert summary["train_s"] == pytest.approx(14.0)  # 15 s of steps less the 1 s save
    assert summary["startup_s"] == pytest.approx(31.0)
    assert summary["trajectories"] == 48 and summary["calc_trajectories"] == 24
    assert summary["reward"] == [0.1, 0.2, 0.3]
    assert summary["diagnostics"]["turn_lag_mean"] == pytest.approx(1.5)
    assert summary["diagnostics"]["turn_lag_max"] == 3.0  # the largest, not the mean
    assert summary["diagnostics"]["behaviour_kl"] == pytest.approx(0.02)  # found under the actor/ prefix
    assert "clipfrac" not in summary["diagnostics"]  # absent metrics stay absent


def test_pair_record_speedups_and_trajectories():
    sync, asynchronous = _run([10.0, 10.0, 11.0], 8.0), _run([6.0, 2.0, 3.0], 6.0)
    sync["steps"][1]["agentrl/agent_loop_ready_s"] = 5.0
    asynchronous["steps"][1]["agentrl/agent_loop_ready_s"] = 6.0
    runs = {"sync": summarise(sync), "async": summarise(asynchronous)}
    assert runs["async"]["agent_loop_ready_s"] == 6.0
    record = pair_record(3, runs, {"sync": 0.4, "async": 0.35}, 200)
    assert record["seed"] == 3 and record["held_out_episodes"] == 200
    assert record["speedup"] == pytest.approx(30.0 / 10.0)
    assert record["speedup_after_step1"] == pytest.approx(20.0 / 4.0)
    assert record["speedup_with_agent_loop_start"] == pytest.approx(35.0 / 16.0)
    assert record["calc_trajectories"] == {"sync": 24.0, "async": 18.0}
    assert record["held_out"]["async"] == 0.35


def test_mean_and_se():
    assert mean_and_se([2.0]) == (2.0, 0.0)
    mean, se = mean_and_se([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5
    assert se == pytest.approx(math.sqrt((2.25 + 0.25 + 0.25 + 2.25) / 3 / 4))
    with pytest.raises(ValueError):
        mean_and_se([])


def test_paired_statistics_within_one_standard_error():
    pairs = [_pair(0, 0.40, 0.42), _pair(1, 0.30, 0.27), _pair(2, 0.35, 0.35), _pair(3, 0.50, 0.46),
             _pair(4, 0.45, 0.47, speedup=2.0)]
    stats = paired_statistics(pairs, start=0.3)
    diffs = [0.02, -0.03, 0.0, -0.04, 0.02]
    assert stats["held_out_start"] == 0.3
    assert stats["held_out_diff"] == pytest.approx(sum(diffs) / 5)
    assert stats["held_out_diff_se"] == pytest.approx(mean_and_se(diffs)[1])
    assert stats["async_lower_pairs"] == 2
    assert stats["async_within_one_se"] is True
    assert stats["held_out_sync"] == pytest.approx(0.40)
    assert stats["speedup_mean"] == pytest.approx(2.8) and stats["speedup_min"] == 2.0
    assert stats["speedup_after_step1_mean"] == pytest.approx(3.3)
    assert stats["seeds"] == [0, 1, 2, 3, 4]


def test_paired_statistics_flags_a_consistent_loss():
    pairs = [_pair(s, 0.40, 0.40 - 0.05 - 0.01 * s) for s in range(5)]
    stats = paired_statistics(pairs)
    assert stats["held_out_diff"] < -stats["held_out_diff_se"]
    assert stats["async_within_one_se"] is False
    assert stats["async_lower_pairs"] == 5


def test_paired_statistics_gives_no_verdict_for_one_evaluated_pair():
    unevaluated = _pair(1, 0.4, 0.4)
    unevaluated["held_out"] = {}
    stats = paired_statistics([_pair(0, 0.40, 0.45), unevaluated])
    assert stats["held_out_pairs"] == 1 and stats["held_out_diff"] == pytest.approx(0.05)
    assert stats["async_within_one_se"] is None
    assert stats["speedup_mean"] == 3.0  # both pairs count for speed


def test_paired_statistics_without_evaluation_reports_speed_only():
    pair = _pair(0, 0.4, 0.4)
    pair["held_out"] = {}
    stats = paired_statistics([pair])
    assert stats["speedup_mean"] == 3.0
    assert "held_out_diff" not in stats and "held_out_start" not in stats


def test_summary_markdown_has_a_row_per_seed_and_the_verdict():
    pairs = [_pair(0, 0.40, 0.30), _pair(1, 0.30, 0.22)]
    assert "agent loop" not in summary_markdown(pairs, paired_statistics(pairs), "")  # pairs from before it existed
    for pair, speedup in zip(pairs, (2.0, 2.5), strict=True):
        pair["speedup_with_agent_loop_start"] = speedup
    text = summary_markdown(pairs, paired_statistics(pairs, start=0.25), "settings line")
    rows = [line for line in text.splitlines() if line.startswith("| 0 ") or line.startswith("| 1 ")]
    assert len(rows) == 2
    assert "| 0.300 | 0.220 | -0.080 |" in rows[1] and "| 128 / 120 |" in rows[1]
    assert "not within one standard error" in text and "settings line" in text
    assert "start model: 0.250" in text
    assert "2.25 counting the agent loop workers' start-up" in text


def test_parse_args_defaults_and_repeated_options():
    args = parse_args([])
    assert args.seeds == [0] and args.parallel == 1 and args.correction == "bypass"
    assert "algorithm.rollout_correction.bypass_mode=true" in CORRECTIONS[args.correction]
    # A child process gets the parent's command line plus its own options: the last occurrence wins.
    child = parse_args(["--seeds", "0", "1", "--steps", "12", "--seeds", "1", "--parallel", "1"])
    assert child.seeds == [1] and child.steps == 12
    with pytest.raises(SystemExit):
        parse_args(["--parallel", "0"])
    with pytest.raises(SystemExit):
        parse_args(["--tasks", "calc", "calc"])


def test_stack_serves_the_chosen_tasks_with_latency_on_calc_only():
    calc = async_vs_sync.stack_config(parse_args([]), seed=3)["workers"]
    assert [w["task"] for w in calc] == ["calc"]
    assert calc[0]["options"]["seed"] == 3 and calc[0]["options"]["step_latency"]["median_s"] == 0.5
    both = async_vs_sync.stack_config(parse_args(["--tasks", "calc", "db"]), seed=3)["workers"]
    assert [w["task"] for w in both] == ["calc", "db"] and "step_latency" not in both[1]["options"]
    # Pairs trained on other tasks are another experiment: not resumed.
    assert pair_settings(parse_args([]), Path("m")) != pair_settings(parse_args(["--tasks", "calc", "db"]), Path("m"))


def _args(*extra: str):
    return parse_args(["--steps", "3", "--eval-size", "200", *extra])


def _trained(tmp_path, args, seed: int, model, evaluated: bool) -> dict:
    """A seed folder as run_pair leaves it: final models exported, pair.json after training (and evaluation)."""
    runs = {}
    for mode in ("sync", "async"):
        export = tmp_path / f"ckpt_{mode}" / "global_step_3" / "actor" / "huggingface"
        export.mkdir(parents=True)
        (export / "config.json").write_text("{}")
        runs[mode] = summarise({**_run([3.0, 2.0, 1.0], 8.0), "model": export})
    held_out = {"sync": 0.4, "async": 0.45} if evaluated else {}
    write_pair(tmp_path, pair_record(seed, runs, held_out, args.eval_size if evaluated else 0), runs,
               pair_settings(args, model))
    return runs


@pytest.fixture
def no_verl(monkeypatch):
    """Training and evaluation replaced by recorders: what run_pair asks for, without verl or a model."""
    calls = {"train": 0, "evaluate": []}

    def train(args, seed, workdir, model):
        calls["train"] += 1
        return {mode: summarise({**_run([3.0, 2.0, 1.0], 8.0), "model": workdir / mode}) for mode in ("sync", "async")}

    def evaluate(models, start, size):
        calls["evaluate"].append(sorted(models))
        return {name: 0.5 for name in models}

    monkeypatch.setattr(async_vs_sync, "train_pair", train)
    monkeypatch.setattr(async_vs_sync, "held_out_success", evaluate)
    return calls


def test_run_pair_keeps_a_pair_already_evaluated(tmp_path, no_verl):
    args, model = _args(), tmp_path / "warmup-abc"
    _trained(tmp_path, args, 4, model, evaluated=True)
    pair = run_pair(args, 4, tmp_path, model)
    assert pair["held_out"] == {"sync": 0.4, "async": 0.45}
    assert no_verl == {"train": 0, "evaluate": []}


def test_run_pair_only_evaluates_a_trained_pair_whose_models_are_there(tmp_path, no_verl):
    args, model = _args(), tmp_path / "warmup-abc"
    runs = _trained(tmp_path, args, 4, model, evaluated=False)
    pair = run_pair(args, 4, tmp_path, model)
    assert no_verl == {"train": 0, "evaluate": [["async", "sync"]]}
    assert pair["held_out"] == {"sync": 0.5, "async": 0.5} and pair["held_out_episodes"] == 200
    saved = json.loads((tmp_path / "pair.json").read_text())
    assert saved["held_out_episodes"] == 200
    assert saved["runs"]["async"]["model"] == runs["async"]["model"]  # the training's figures are kept
    assert not (tmp_path / "pair.json.tmp").exists()


def test_run_pair_trains_again_when_the_models_are_gone(tmp_path, no_verl):
    args, model = _args(), tmp_path / "warmup-abc"
    _trained(tmp_path, args, 4, model, evaluated=False)
    (tmp_path / "ckpt_async" / "global_step_3" / "actor" / "huggingface" / "config.json").unlink()
    run_pair(args, 4, tmp_path, model)
    assert no_verl["train"] == 1 and len(no_verl["evaluate"]) == 1
    assert json.loads((tmp_path / "pair.json").read_text())["runs"]["async"]["model"] == str(tmp_path / "async")


def test_run_pair_evaluates_again_at_another_eval_size_and_not_at_zero(tmp_path, no_verl):
    model = tmp_path / "warmup-abc"
    _trained(tmp_path, _args(), 4, model, evaluated=True)
    assert run_pair(_args("--eval-size", "100"), 4, tmp_path, model)["held_out_episodes"] == 100
    assert no_verl == {"train": 0, "evaluate": [["async", "sync"]]}
    assert run_pair(_args("--eval-size", "0"), 4, tmp_path, model)["held_out_episodes"] == 100  # kept as it is
    assert no_verl["evaluate"] == [["async", "sync"]]


def test_a_pair_of_other_settings_is_not_resumed(tmp_path, no_verl):
    model = tmp_path / "warmup-abc"
    _trained(tmp_path, _args(), 4, model, evaluated=True)
    with pytest.raises(ValueError, match="other settings|not"):
        run_pair(_args("--max-staleness", "1"), 4, tmp_path, model)
    with pytest.raises(ValueError):
        saved_record(tmp_path / "pair.json", pair_settings(_args(), tmp_path / "another-model"))
    assert no_verl["train"] == 0


def test_pair_done():
    assert not pair_done(None, 200) and not pair_done(None, 0)
    assert pair_done({"held_out_episodes": 0}, 0)
    assert not pair_done({"held_out_episodes": 0}, 200)
    assert pair_done({"held_out_episodes": 200}, 200) and not pair_done({"held_out_episodes": 100}, 200)


class _FinishedChild:
    """A child process that has already written its seed's evaluated pair.json."""

    launched: list[list[str]] = []

    def __init__(self, cmd, **kwargs):
        self.launched.append(cmd)
        args = parse_args(cmd[3:])  # [python, -m, bench.async_vs_sync, ...]
        _trained(Path(args.out), args, args.seeds[0], Path(args.model), evaluated=True)
        self.pid, self.returncode = 0, 0

    def poll(self):
        return self.returncode


def test_run_children_starts_only_the_pairs_not_done(tmp_path, monkeypatch):
    argv = ["--steps", "3", "--seeds", "0", "1", "2", "--parallel", "2"]
    args, model = parse_args(argv), tmp_path / "warmup-abc"
    for seed in (0, 2):
        (tmp_path / f"seed_{seed}").mkdir()
        _trained(tmp_path / f"seed_{seed}", args, seed, model, evaluated=True)
    _FinishedChild.launched = []
    monkeypatch.setattr(subprocess, "Popen", _FinishedChild)
    monkeypatch.setattr(common.time, "sleep", lambda s: None)
    pairs = run_children(args, argv, tmp_path, model)
    assert [parse_args(cmd[3:]).seeds for cmd in _FinishedChild.launched] == [[1]]
    assert [p["seed"] for p in pairs] == [0, 1, 2]


def test_start_held_out_is_evaluated_once_per_folder(tmp_path, no_verl):
    model = tmp_path / "warmup-abc"
    assert start_held_out(tmp_path, None, 200) is None  # --report before any evaluation
    assert start_held_out(tmp_path, model, 0) is None  # no evaluation asked for
    assert start_held_out(tmp_path, model, 200) == 0.5
    assert start_held_out(tmp_path, model, 200) == 0.5
    assert no_verl["evaluate"] == [["start"]]
    assert start_held_out(tmp_path, None, 100) == 0.5  # --report reads what is there
    start_held_out(tmp_path, model, 100)  # another size (or model): evaluated again
    assert no_verl["evaluate"] == [["start"], ["start"]]


def test_load_pairs_leaves_out_unfinished_seeds(tmp_path):
    (tmp_path / "seed_0").mkdir()
    (tmp_path / "seed_1").mkdir()
    (tmp_path / "seed_1" / "pair.json").write_text(json.dumps(_pair(1, 0.3, 0.35)))
    pairs = load_pairs({0: tmp_path / "seed_0", 1: tmp_path / "seed_1"})
    assert [p["seed"] for p in pairs] == [1]
    with pytest.raises(FileNotFoundError):
        load_pairs({0: tmp_path / "seed_0"})


class _Stack:
    """An environment stack that starts nothing."""

    def __init__(self, config, log_dir):
        self.url = f"http://stack-{id(self)}"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture
def fake_runs(monkeypatch):
    """train_pair without environment processes or verl: run_training is given per mode by the test."""
    monkeypatch.setattr(async_vs_sync, "EnvStack", _Stack)
    monkeypatch.setattr(async_vs_sync, "agentrl_verl_cli", lambda argv: 0)
    behaviours = {}
    urls = {}

    def run_training(mode, args, seed, workdir, model, env_url, stop=None, cpus=None):
        urls[mode] = env_url
        urls[f"{mode} cpus"] = cpus
        return behaviours[mode](stop)

    monkeypatch.setattr(async_vs_sync, "run_training", run_training)
    return behaviours, urls


def _finished(stop):
    return {**_run([3.0, 2.0, 1.0], 8.0), "model": "/m"}


def test_train_pair_gives_each_run_its_own_stack_in_both_layouts(tmp_path, fake_runs):
    behaviours, urls = fake_runs
    behaviours.update({"sync": _finished, "async": _finished})
    for extra in ([], ["--arms-at-once"]):
        runs = async_vs_sync.train_pair(_args(*extra), 0, tmp_path, tmp_path / "m")
        assert set(runs) == {"sync", "async"} and runs["async"]["train_s"] == pytest.approx(5.0)
        assert urls["sync"] != urls["async"]


@pytest.mark.parametrize("failing_mode", ["sync", "async"])
def test_train_pair_at_once_stops_the_other_run_when_one_fails(tmp_path, fake_runs, failing_mode):
    import threading

    behaviours, _ = fake_runs
    stopped = threading.Event()

    def failing(stop):
        raise RuntimeError(f"{failing_mode} run failed")

    def waiting(stop):
        if not stop.wait(timeout=10):  # set by train_pair once the other run has failed
            return _finished(stop)
        stopped.set()
        raise RuntimeError("stopped")

    other = "async" if failing_mode == "sync" else "sync"
    behaviours.update({failing_mode: failing, other: waiting})
    with pytest.raises(RuntimeError, match=f"{failing_mode} run failed"):
        async_vs_sync.train_pair(_args("--arms-at-once"), 0, tmp_path, tmp_path / "m")
    assert stopped.is_set()


def test_cpu_shares_and_lists():
    assert cpu_shares(set(range(64)), 5) == [set(range(i * 12, i * 12 + 12)) for i in range(5)]
    assert cpu_shares({3, 1, 2, 0, 7}, 2) == [{0, 1}, {2, 3}]
    with pytest.raises(ValueError, match="--pin"):
        cpu_shares({0, 1}, 3)
    assert cpu_list({0, 1, 2, 3, 4, 5}) == "0-5" and cpu_list({0, 2, 3, 9}) == "0,2-3,9"


needs_two_cpus = pytest.mark.skipif(len(getattr(os, "sched_getaffinity", lambda pid: [])(0)) < 2,
                                    reason="CPU affinity with two CPUs or more")


@needs_two_cpus
def test_train_pair_pinned_at_once_gives_each_run_half_of_the_pairs_cpus(tmp_path, fake_runs):
    behaviours, urls = fake_runs
    behaviours.update({"sync": _finished, "async": _finished})
    async_vs_sync.train_pair(_args("--arms-at-once", "--pin"), 0, tmp_path, tmp_path / "m")
    halves = cpu_shares(os.sched_getaffinity(0), 2)
    assert [urls["sync cpus"], urls["async cpus"]] == halves
    async_vs_sync.train_pair(_args("--pin"), 0, tmp_path, tmp_path / "m")  # one after the other: the whole share
    assert urls["sync cpus"] is None and urls["async cpus"] is None


@needs_two_cpus
def test_run_children_pinned_starts_each_pair_on_its_own_cpus(tmp_path, monkeypatch):
    argv = ["--steps", "3", "--seeds", "0", "1", "2", "--parallel", "2", "--pin"]
    args, model = parse_args(argv), tmp_path / "warmup-abc"
    affinity = {}

    class Child(_FinishedChild):
        def __init__(self, cmd, **kwargs):
            affinity[parse_args(cmd[3:]).seeds[0]] = os.sched_getaffinity(0)  # what the child inherits
            super().__init__(cmd, **kwargs)

    before = os.sched_getaffinity(0)
    monkeypatch.setattr(subprocess, "Popen", Child)
    monkeypatch.setattr(common.time, "sleep", lambda s: None)
    run_children(args, argv, tmp_path, model)
    first, second = cpu_shares(before, 2)
    # Seeds 0 and 1 start together; seed 2 takes the share seed 0 gave back.
    assert affinity == {0: first, 1: second, 2: first}
    assert os.sched_getaffinity(0) == before
