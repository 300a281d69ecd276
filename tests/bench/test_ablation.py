"""The parts of ``bench.ablation`` that need no verl: the arms and workload, per-run summaries, the bookkeeping that
resumes a bench that was cut off, the statistics over seeds and the report."""

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from agentrl_verl.presets import CONFIG_DIR
from bench import ablation
from bench.ablation import (
    FAMILIES,
    FIXED,
    HELD_OUT,
    STALE_SHARES,
    START,
    arm_statistics,
    arms,
    describe,
    headline,
    jobs,
    load_runs,
    parse_args,
    run_children,
    run_done,
    run_folder,
    run_one,
    run_settings,
    size_overrides,
    summary_markdown,
    train_summary,
    workload,
    write_run,
)
from bench.common import cpu_shares, saved_record


def test_arms_switch_off_one_mechanism_each_or_train_one_family():
    named = arms()
    assert list(named) == ["full", "fixed_pool", "no_task_norm", "no_cross_policy", "single_calc", "single_kg",
                           "single_webshop", "single_alfworld", "sync"]
    assert named["sync"].overrides == ("trainer.v1.trainer_mode=agentrl_sync",) and named["sync"].families == FAMILIES
    assert named["full"].overrides == () and named["full"].families == FAMILIES and not named["full"].fixed_model
    assert named["fixed_pool"].fixed_model and named["fixed_pool"].families == FAMILIES
    assert named["no_task_norm"].overrides == ("agentrl.task_adv_norm=off",)
    assert named["no_cross_policy"].overrides == ("agentrl.cross_policy.enable=false",)
    assert named["single_kg"].families == ("kg",) and named["single_kg"].overrides == ()


def test_workload_is_the_multitask_demo_or_some_of_its_families_and_holds_out_the_same_indices():
    config = workload()
    preset = yaml.safe_load((Path(CONFIG_DIR) / "demo_multitask.yaml").read_text())
    assert [t.name for t in config.tasks] == list(FAMILIES) == [t["name"] for t in preset["tasks"]]
    assert [t.name for t in workload(("calc", "webshop")).tasks] == ["calc", "webshop"]
    assert all(t.held_out == HELD_OUT and t.learnable for t in config.tasks)
    # Sampled at the temperature the RL rollout samples at (the demo preset's).
    rollout = yaml.safe_load((Path(CONFIG_DIR) / "demo" / "tiny.yaml").read_text())["actor_rollout_ref"]["rollout"]
    assert config.eval.temperature == rollout["temperature"]


def test_size_overrides_keep_one_mini_batch_per_step_and_one_group_per_micro_batch():
    assert size_overrides(None, None) == []
    assert size_overrides(6, 4) == ["data.train_batch_size=6", "actor_rollout_ref.actor.ppo_mini_batch_size=6",
                                    "actor_rollout_ref.rollout.n=4",
                                    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"]


def test_parse_args_defaults_and_limits():
    args = parse_args([])
    # The paper's ablation by default; the synchronous arm (the speedup's baseline) when named.
    assert args.arms == [arm for arm in arms() if arm != "sync"] and args.seeds == [0, 1, 2]
    assert args.eval_size == HELD_OUT and parse_args(["--arms", "full", "sync"]).arms == ["full", "sync"]
    with pytest.raises(SystemExit):
        parse_args(["--eval-size", str(HELD_OUT + 1)])
    with pytest.raises(SystemExit):
        parse_args(["--report"])  # needs --out
    with pytest.raises(SystemExit):
        parse_args(["--arms", "no_such_arm"])


def test_families_option_sets_the_arms_and_keeps_the_presets_order():
    args = parse_args(["--families", "webshop", "calc", "kg"])
    assert args.families == ("calc", "kg", "webshop")  # the preset's order, whatever the command's
    assert args.arms == [arm for arm in arms(("calc", "kg", "webshop")) if arm != "sync"]
    assert "single_alfworld" not in args.arms and arms(args.families)["full"].families == args.families
    with pytest.raises(SystemExit):
        parse_args(["--families", "calc", "--arms", "single_kg"])  # not an arm of that bench
    with pytest.raises(SystemExit):
        parse_args(["--families", "calc", "calc"])
    with pytest.raises(SystemExit):
        parse_args(["--families", "os"])  # not a family of the multi-task preset


def _step(step: int, families: dict[str, float], seconds: float = 10.0, save: float | None = None) -> dict:
    data = {"timing_s/step": seconds, "agentrl/all/episodes": sum(families.values())}
    for family, episodes in families.items():
        data.update({f"agentrl/{family}/episodes": episodes, f"agentrl/{family}/reward": 0.1 * step,
                     f"agentrl/{family}/success_rate": 0.5, f"agentrl/{family}/generated_tokens": 40.0})
    if save is not None:
        data["timing_s/save_checkpoint"] = save
    return {"step": step, "data": data}


def test_train_summary_counts_trajectories_per_family_and_leaves_out_the_final_save():
    history = [_step(2, {"calc": 24.0, "kg": 40.0}, save=3.0), _step(1, {"calc": 64.0})]  # out of order
    summary = train_summary(history, FAMILIES)
    assert summary["steps"] == 2 and summary["train_s"] == pytest.approx(17.0)
    assert summary["trajectories"] == 128
    assert summary["families"]["calc"]["trajectories"] == 88 and summary["families"]["kg"]["trajectories"] == 40
    assert summary["families"]["calc"]["reward"] == [0.1, 0.2]
    assert summary["families"]["kg"]["reward"] == [None, 0.2]  # no kg episode in step 1
    assert summary["families"]["webshop"]["trajectories"] == 0
    assert summary["cross_policy"] is None  # no cross-policy metrics: switched off


def test_train_summary_of_cross_policy_weights_each_steps_success_by_its_trajectories():
    from agentrl_verl.core.cross_policy import cross_policy_metrics

    history = []
    for step, (policies, successes) in enumerate([([["current"] * 2, ["current", "stale"]], [True, False]),
                                                  ([["current"] * 2] * 3 + [["stale"] * 4], [False] * 3 + [True])],
                                                 start=1):
        row = _step(step, {"calc": 4.0})
        row["data"].update({**cross_policy_metrics(policies, successes), "cross_policy/stale_version_lag": 2.0 * step,
                            "actor/pg_clipfrac": 0.01 * step, "actor/ppo_kl": 0.001})
        history.append(row)
    summary = train_summary(history, FAMILIES)
    assert set(summary["cross_policy"]["by_stale_share"]) == set(STALE_SHARES)  # every bin the metrics have
    assert summary["cross_policy"]["by_stale_share"]["0"] == {"trajectories": 4, "success": 0.25}
    assert summary["cross_policy"]["by_stale_share"]["0.25-0.5"] == {"trajectories": 1, "success": 0.0}
    assert summary["cross_policy"]["by_stale_share"]["0.75-1"] == {"trajectories": 1, "success": 1.0}
    assert summary["cross_policy"]["by_stale_share"]["0-0.25"] == {"trajectories": 0, "success": None}
    assert summary["cross_policy"]["mixed_share"] == pytest.approx(0.25) and summary["cross_policy"]["stale_lag"] == 3
    assert summary["off_policy"] == {"clip_fraction": pytest.approx(0.015), "kl": pytest.approx(0.001)}
    assert summary["cross_policy"]["member"] == "stale"
    lines = ablation.cross_policy_table([{"arm": "full", "seed": 0, "train": summary}])
    assert ("| full | 0 | 0.0150 | 0.0010 | stale | 0.25 | 0.33 | 3.0 | - | - | 0.25 (4) | - | 0.00 (1) | - "
            "| 1.00 (1) |") in lines


def test_train_summary_of_a_fixed_pool_member_has_its_turns_and_log_probs_and_no_lag():
    from agentrl_verl.core.cross_policy import cross_policy_metrics

    policies = [["current", "fixed"], ["current", "current"], ["fixed", "fixed", "current", "current"]]
    spans = [[[0, 2], [3, 5]], [[0, 1], [2, 3]], [[0, 1], [1, 2], [2, 3], [3, 4]]]
    logprobs = [[-0.5, -0.5, 0.0, -2.0, -2.0], [-1.0, 0.0, -1.0], [-3.0, -3.0, -0.5, -0.5]]
    row = _step(1, {"calc": 3.0})
    row["data"].update(cross_policy_metrics(policies, [True, False, True], members=("current", "fixed"),
                                            turn_spans=spans, response_logprobs=logprobs))
    cross = train_summary([row], FAMILIES)["cross_policy"]
    assert cross["member"] == "fixed" and cross["stale_turns"] == pytest.approx(0.375)  # 3 of 8 turns
    assert cross["stale_lag"] is None  # a fixed model has no weight version
    assert cross["logprob"] == {"current": pytest.approx(-4 / 6, abs=1e-5), "fixed": pytest.approx(-2.5)}
    assert cross["by_stale_share"]["0.25-0.5"] == {"trajectories": 2, "success": 1.0}
    lines = ablation.cross_policy_table([{"arm": "fixed_pool", "seed": 2, "train": train_summary([row], FAMILIES)}])
    assert ("| fixed_pool | 2 | - | - | fixed | 0.67 | 0.38 | - | -0.667 | -2.500 | 0.00 (1) | - | 1.00 (2) | - "
            "| - |") in lines


THREE = ("calc", "kg", "webshop")
"""The families of the records below: a bench with ``--families calc kg webshop`` (or one made before alfworld)."""


def _held_out(success: dict[str, float], episodes: int = 100) -> dict:
    return {f: {"success": rate, "reward": rate, "partial": 0.0, "turns": 2.0, "episodes": episodes}
            for f, rate in success.items()}


def _record(arm: str, seed: int, success: dict[str, float] | None, steps: int = 12) -> dict:
    record = {"arm": arm, "seed": seed,
              "settings": {"arm": arm, "steps": steps, "batch": None, "n": None, "overrides": [], "model": "w"}}
    if arm != START:
        trained = arms(THREE)[arm].families
        record["train"] = train_summary([_step(1, {f: 64.0 / len(trained) for f in trained})], THREE)
    if success is not None:
        record.update(held_out=_held_out(success), eval_size=100)
    return record


def test_arm_statistics_over_seeds_and_the_specialists_row():
    records = [_record(START, 0, {"calc": 0.4, "kg": 0.2, "webshop": 0.3}),
               _record("full", 0, {"calc": 0.6, "kg": 0.3, "webshop": 0.3}),
               _record("full", 1, {"calc": 0.4, "kg": 0.3, "webshop": 0.5}),
               _record("no_task_norm", 0, None)]  # trained, not evaluated: left out
    for seed in (0, 1):
        for family in THREE:
            success = dict.fromkeys(THREE, 0.0) | {family: 0.5 + 0.1 * seed}
            records.append(_record(f"single_{family}", seed, success))
    stats = arm_statistics(records)
    assert list(stats) == [START, "full", "single_calc", "single_kg", "single_webshop", "specialists"]
    assert stats["full"]["calc"] == pytest.approx((0.5, 0.1))
    assert stats["full"]["mean"] == pytest.approx((0.4, 0.0))  # both seeds average 0.4 over families
    assert stats[START]["seeds"] == [0] and stats[START]["kg"] == (0.2, 0.0)
    assert stats["specialists"]["kg"] == pytest.approx((0.55, 0.05))
    assert stats["specialists"]["mean"] == pytest.approx((0.55, 0.05))  # each specialist on its own family
    assert stats["single_kg"]["mean"] == pytest.approx((0.55 / 3, 0.05 / 3))


def test_paired_differences_pair_the_multi_task_arms_by_their_common_seeds():
    records = [_record(START, 0, {"calc": 0.4, "kg": 0.2, "webshop": 0.3}),
               _record("full", 0, {"calc": 0.6, "kg": 0.3, "webshop": 0.3}),
               _record("full", 1, {"calc": 0.4, "kg": 0.3, "webshop": 0.5}),
               _record("full", 2, {"calc": 0.9, "kg": 0.9, "webshop": 0.9}),  # no partner
               _record("no_cross_policy", 0, {"calc": 0.5, "kg": 0.3, "webshop": 0.1}),
               _record("no_cross_policy", 1, {"calc": 0.5, "kg": 0.3, "webshop": 0.2}),
               _record("no_task_norm", 0, {"calc": 0.5, "kg": 0.3, "webshop": 0.1}),  # one seed: no pair
               _record("single_calc", 0, {"calc": 0.9, "kg": 0.0, "webshop": 0.0}),
               _record("single_calc", 1, {"calc": 0.9, "kg": 0.0, "webshop": 0.0})]
    pairs = ablation.paired_differences(records)
    assert list(pairs) == ["full - no_cross_policy"]
    row = pairs["full - no_cross_policy"]
    assert row["seeds"] == [0, 1] and row["calc"] == pytest.approx((0.0, 0.1)) and row["kg"] == pytest.approx((0, 0))
    assert row["webshop"] == pytest.approx((0.25, 0.05)) and row["mean"] == pytest.approx((0.25 / 3, 0.05 / 3))
    text = summary_markdown(records, arm_statistics(records), describe(records))
    assert ("| full - no_cross_policy | 2 | +0.000 +- 0.100 | +0.000 +- 0.000 | +0.250 +- 0.050 | +0.083 +- 0.017 |"
            in text)


def test_no_specialists_row_without_every_single_task_arm():
    records = [_record("single_calc", 0, {"calc": 0.6, "kg": 0.0, "webshop": 0.0})]
    assert "specialists" not in arm_statistics(records)


def test_summary_markdown_table_in_the_papers_layout_and_the_headline():
    records = [_record(START, 0, {"calc": 0.4, "kg": 0.2, "webshop": 0.3}),
               _record("full", 0, {"calc": 0.6, "kg": 0.3, "webshop": 0.3}),
               _record("full", 1, {"calc": 0.4, "kg": 0.3, "webshop": 0.5})]
    stats = arm_statistics(records)
    text = summary_markdown(records, stats, describe(records))
    assert "| arm | seeds | calc | kg | webshop | mean |" in text
    assert "| full | 2 | 0.500 +- 0.100 | 0.300 +- 0.000 | 0.400 +- 0.100 | 0.400 +- 0.000 |" in text
    assert "over 100 held-out episodes (binomial standard error at most 0.050" in text
    assert "| calc | 0.40 | 0.40 | 0.00 | 2.0 | 40.00 | - | 0.50 |" in text  # the families' table
    assert "| full | 1 | 1 | 64 | 21 | 21 | 21 | 10 |" in text  # the training table
    assert "| full | 1 | - | - | - | - | - | - | - | - | - | - |" in text  # no cross-policy or actor metrics
    assert "12 steps of the preset groups" in text
    assert headline(stats) == "start=0.300 start_se=0.000 full=0.400 full_se=0.000"


def test_run_done_needs_every_family_at_the_eval_size(tmp_path):
    assert not run_done(None, 100, THREE)
    assert not run_done(_record("full", 0, None), 100, THREE)  # trained only
    assert run_done(_record("full", 0, {"calc": 0.5, "kg": 0.5, "webshop": 0.5}), 100, THREE)
    assert not run_done(_record("full", 0, {"calc": 0.5, "kg": 0.5, "webshop": 0.5}), 50, THREE)
    assert not run_done(_record("full", 0, {"calc": 0.5, "kg": 0.5, "webshop": 0.5}), 100, FAMILIES)  # no alfworld


def test_saved_run_refuses_other_settings(tmp_path):
    args, model = parse_args([]), tmp_path / "warmup-abc"
    settings = run_settings(args, "full", model)
    assert saved_record(tmp_path / "run.json", settings) is None
    write_run(tmp_path, {"arm": "full", "seed": 0, "settings": settings})
    assert saved_record(tmp_path / "run.json", settings)["arm"] == "full"
    with pytest.raises(ValueError, match="use another --out"):
        saved_record(tmp_path / "run.json", run_settings(parse_args(["--steps", "3"]), "full", model))
    assert run_settings(args, START, model)["steps"] == 0  # the start model does not train


class _Stack:
    url = "http://stack"

    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture
def no_verl(monkeypatch):
    calls = {"train": [], "evaluate": []}

    async def indices(url, tasks):
        return {t.name: list(range(HELD_OUT + 10)) for t in tasks}

    def train(args, arm, spec, seed, folder, model, config, url, train_split, held_out):
        calls["train"].append((arm, seed, sorted(train_split[f][0] for f in spec.families)))
        final = folder / "checkpoints" / "huggingface"
        final.mkdir(parents=True)
        (final / "config.json").write_text("{}")
        (folder / "metrics.jsonl").write_text(json.dumps(_step(1, dict.fromkeys(spec.families, 8.0))) + "\n")
        return final

    def evaluate(model_path, start, url, held_out, config, eval_size):
        calls["evaluate"].append(Path(model_path).name)
        assert all(len(v) == HELD_OUT for v in held_out.values())
        return _held_out(dict.fromkeys(held_out, 0.5), eval_size)

    monkeypatch.setattr(ablation, "EnvStack", _Stack)
    monkeypatch.setattr(ablation, "task_indices", indices)
    monkeypatch.setattr(ablation, "train_run", train)
    monkeypatch.setattr(ablation, "evaluate", evaluate)
    return calls


def test_run_one_trains_then_evaluates_and_resumes(tmp_path, no_verl):
    args, model, config = parse_args([]), tmp_path / "warmup-abc", workload()
    folder = run_folder(tmp_path, "single_kg", 1)
    record = run_one(args, "single_kg", 1, folder, model, config)
    assert no_verl["train"] == [("single_kg", 1, [HELD_OUT])]  # trains after the held-out indices
    assert record["train"]["families"]["kg"]["trajectories"] == 8 and record["held_out"]["kg"]["success"] == 0.5
    assert json.loads((folder / "run.json").read_text()) == record
    run_one(args, "single_kg", 1, folder, model, config)  # done: kept
    assert len(no_verl["train"]) == 1 and no_verl["evaluate"] == ["huggingface"]
    run_one(parse_args(["--eval-size", "50"]), "single_kg", 1, folder, model, config)  # trained: only evaluated
    assert len(no_verl["train"]) == 1 and len(no_verl["evaluate"]) == 2


def test_run_one_evaluates_the_start_model_without_training(tmp_path, no_verl):
    model = tmp_path / "warmup-abc"
    record = run_one(parse_args([]), START, 0, run_folder(tmp_path, START, 0), model, workload())
    assert no_verl["train"] == [] and no_verl["evaluate"] == ["warmup-abc"] and "train" not in record
    assert load_runs(tmp_path) == [record]


class _FinishedChild:
    launched: list = []

    def __init__(self, cmd, **kwargs):
        self.launched.append(cmd)
        self.pid, self.returncode = 0, 0

    def poll(self):
        return 0


def test_run_children_starts_only_the_runs_not_done(tmp_path, monkeypatch):
    argv = ["--arms", "full", "single_calc", "--seeds", "0", "1", "--parallel", "3"]
    args, model = parse_args(argv), tmp_path / "warmup-abc"
    assert jobs(args) == [(START, 0), ("full", 0), ("single_calc", 0), ("full", 1), ("single_calc", 1)]
    for arm, seed in (("full", 1),):
        folder = run_folder(tmp_path, arm, seed)
        folder.mkdir(parents=True)
        write_run(folder, {**_record(arm, seed, dict.fromkeys(FAMILIES, 0.5)), "settings": run_settings(args, arm,
                                                                                                        model)})
    _FinishedChild.launched = []
    monkeypatch.setattr(subprocess, "Popen", _FinishedChild)
    monkeypatch.setattr("bench.common.time.sleep", lambda s: None)  # run_processes polls
    run_children(args, argv, tmp_path, model)
    launched = [parse_args([a for a in cmd[3:] if a != "--child"]) for cmd in _FinishedChild.launched]
    assert [(a.arms, a.seeds, a.parallel) for a in launched] == [
        ([START], [0], 1), (["full"], [0], 1), (["single_calc"], [0], 1), (["single_calc"], [1], 1)]
    assert jobs(launched[0]) == [(START, 0)]  # the child evaluates the start model only
    assert all("--child" in cmd for cmd in _FinishedChild.launched)


@pytest.mark.skipif(len(getattr(os, "sched_getaffinity", lambda pid: [])(0)) < 2,
                    reason="CPU affinity with two CPUs or more")
def test_run_children_pinned_starts_each_run_on_its_own_cpus(tmp_path, monkeypatch):
    argv = ["--arms", "full", "--seeds", "0", "1", "--parallel", "2", "--pin"]
    args, model = parse_args(argv), tmp_path / "warmup-abc"
    affinity = {}

    class Child(_FinishedChild):
        def __init__(self, cmd, **kwargs):
            child = parse_args([a for a in cmd[3:] if a != "--child"])
            affinity[child.arms[0], child.seeds[0]] = os.sched_getaffinity(0)  # what the child inherits
            super().__init__(cmd, **kwargs)

    before = os.sched_getaffinity(0)
    monkeypatch.setattr(subprocess, "Popen", Child)
    monkeypatch.setattr("bench.common.time.sleep", lambda s: None)  # run_processes polls
    run_children(args, argv, tmp_path, model)
    first, second = cpu_shares(before, 2)
    # The start model's evaluation and full seed 0 start together; seed 1 takes the share the first one gave back.
    assert affinity == {(START, 0): first, ("full", 0): second, ("full", 1): first}
    assert os.sched_getaffinity(0) == before


def test_a_child_runs_its_one_job_and_the_parent_reports(tmp_path, no_verl, capsys):
    model = tmp_path / "warmup-abc"
    common = ["--out", str(tmp_path / "out"), "--model", str(model), "--eval-size", "8"]
    assert ablation.main(["--arms", START, "--seeds", "0", "--parallel", "1", "--child", *common]) == 0
    assert no_verl == {"train": [], "evaluate": ["warmup-abc"]}
    assert ablation.main(["--arms", "full", "--seeds", "0", "1", *common]) == 0  # in-process, the start kept
    assert [arm for arm, *_ in no_verl["train"]] == ["full", "full"] and len(no_verl["evaluate"]) == 3
    assert capsys.readouterr().out.splitlines()[-1] == "start=0.500 start_se=0.000 full=0.500 full_se=0.000"
    assert (tmp_path / "out" / "summary.md").exists() and (tmp_path / "out" / "summary.json").exists()
    assert ablation.main(["--report", "--out", str(tmp_path / "out")]) == 0  # runs nothing
    assert len(no_verl["evaluate"]) == 3


def test_the_fixed_pool_arm_trains_with_the_fixed_model_in_the_pool_and_evaluates_it_once(tmp_path, no_verl,
                                                                                          monkeypatch):
    overrides = []
    train = ablation.train_run
    monkeypatch.setattr(ablation, "train_run", lambda args, arm, spec, *rest: overrides.append(spec.overrides)
                        or train(args, arm, spec, *rest))
    args = parse_args(["--arms", "full", "fixed_pool", "--seeds", "0"])
    assert jobs(args) == [(START, 0), (FIXED, 0), ("full", 0), ("fixed_pool", 0)]
    assert jobs(parse_args(["--arms", "full", "--seeds", "0"])) == [(START, 0), ("full", 0)]  # no fixed model
    model, fixed = tmp_path / "warmup-abc", tmp_path / "warmup-def"
    for arm, seed in jobs(args):
        run_one(args, arm, seed, run_folder(tmp_path, arm, seed), model, workload(), fixed)
    assert no_verl["evaluate"] == ["warmup-abc", "warmup-def", "huggingface", "huggingface"]
    assert overrides == [(), (f"++agentrl.cross_policy.fixed_model_path={fixed}",)]
    settings = {r["arm"]: r["settings"] for r in load_runs(tmp_path)}
    assert settings[FIXED]["fixed_model"] == settings["fixed_pool"]["fixed_model"] == "warmup-def"
    assert "fixed_model" not in settings["full"] and settings[FIXED]["steps"] == 0
    with pytest.raises(ValueError, match="use another --out"):  # another fixed model is another run
        saved_record(run_folder(tmp_path, "fixed_pool", 0) / "run.json",
                     run_settings(args, "fixed_pool", model, tmp_path / "warmup-ghi"))
    stats = arm_statistics(load_runs(tmp_path))
    assert list(stats) == [START, FIXED, "full", "fixed_pool"]
    assert "fixed pool model warmup-def;" in describe(load_runs(tmp_path))


def test_the_fixed_pool_arm_overrides_compose_with_the_rl_preset(tmp_path):
    from agentrl_verl.pipeline.launch import rl_preset_values
    from agentrl_verl.pipeline.settings import RLSpec

    overrides = ablation.arm_overrides(arms()["fixed_pool"], tmp_path / "warmup-def")
    preset = rl_preset_values(RLSpec(overrides=[*workload().rl.overrides, *overrides]))
    assert preset.agentrl.cross_policy.fixed_model_path == str(tmp_path / "warmup-def")
    assert preset.agentrl.cross_policy.enable
    assert ablation.arm_overrides(arms()["no_cross_policy"], None) == ("agentrl.cross_policy.enable=false",)


def test_run_children_hand_the_fixed_model_to_every_child(tmp_path, monkeypatch):
    argv = ["--arms", "fixed_pool", "--seeds", "0", "--parallel", "2"]
    _FinishedChild.launched = []
    monkeypatch.setattr(subprocess, "Popen", _FinishedChild)
    monkeypatch.setattr("bench.common.time.sleep", lambda s: None)  # run_processes polls
    run_children(parse_args(argv), argv, tmp_path, tmp_path / "warmup-abc", tmp_path / "warmup-def")
    launched = [parse_args([a for a in cmd[3:] if a != "--child"]) for cmd in _FinishedChild.launched]
    assert [(a.arms, a.fixed_model) for a in launched] == [([START], str(tmp_path / "warmup-def")),
                                                           ([FIXED], str(tmp_path / "warmup-def")),
                                                           (["fixed_pool"], str(tmp_path / "warmup-def"))]


def test_the_default_fixed_model_is_the_warm_up_on_another_order_of_the_same_demonstrations(tmp_path):
    from agentrl_verl.pipeline.warmup import plan_warmup
    from bench.ablation import FIXED_WARMUP_SEED, fixed_warmup

    config = workload()
    other = fixed_warmup(config)
    assert other.warmup.seed == FIXED_WARMUP_SEED != config.warmup.seed
    assert other.tasks == config.tasks and other.demonstrations == config.demonstrations
    base = tmp_path / "tiny-qwen2-abc"
    cached = [plan_warmup(base, c, c.tasks, tmp_path).path for c in (other, config)]
    assert cached[0] != cached[1]  # cached apart


def _timed(step: int, seconds: float, gen: float, wait: float | None, latency: float) -> dict:
    row = _step(step, {f: 8.0 for f in FAMILIES}, seconds=seconds)
    row["data"].update({"timing_s/gen": gen, "timing_s/update_actor": 1.0})
    if wait is not None:  # the asynchronous trainer's
        row["data"].update({"timing_s/async/wait_for_batch": wait, "async/trainer_idle_fraction": wait / seconds,
                            "async/rollout_idle_fraction": 0.25})
    for family in FAMILIES:
        row["data"].update({f"agentrl/{family}/env_latency_s": latency, f"agentrl/{family}/generate_s": 2.0,
                            f"agentrl/{family}/env_latency_s_p90": 3 * latency, f"agentrl/{family}/turns_p90": 4.0})
    return row


def test_the_speedup_pairs_sync_and_full_by_seed_and_says_where_the_time_goes():
    records = []
    for seed, (sync_s, full_s) in enumerate([(30.0, 10.0), (20.0, 10.0)]):
        for arm, seconds, wait in (("sync", sync_s, None), ("full", full_s, 1.0)):
            history = [_timed(step, seconds / 2, seconds / 4, wait and wait / 2, 0.5 * step) for step in (1, 2)]
            records.append({"arm": arm, "seed": seed, "train": train_summary(history, FAMILIES)})
    records.append({"arm": "sync", "seed": 7, "train": records[0]["train"]})  # no full run of seed 7: not paired
    timing = records[1]["train"]["timing"]
    assert timing["gen"] == pytest.approx(2.5) and timing["async/wait_for_batch"] == pytest.approx(0.5)
    assert timing["trainer_idle_fraction"] == pytest.approx(0.1) and timing["rollout_idle_fraction"] == 0.25
    assert records[0]["train"]["timing"]["trainer_idle_fraction"] is None  # the synchronous trainer has none
    assert records[0]["train"]["families"]["kg"]["env_latency_s_p90"] == [1.5, 3.0]

    speed = ablation.speedups(records)
    assert speed["seeds"] == [0, 1] and speed["per_seed"] == {0: 3.0, 1: 2.0}
    assert speed["speedup"] == pytest.approx((2.5, 0.5)) and speed["train_s"]["sync"] == pytest.approx((25.0, 5.0))
    lines = ablation.speed_table(records)
    assert "**2.50 +- 0.50** over 2 seeds (seed 0: 3.00, seed 1: 2.00)" in lines[2]
    # async/wait_for_batch, gen, step, update_actor, then the idle fractions (none in the synchronous trainer)
    assert "| full | 0.50 | 2.50 | 5.00 | 1.00 | 0.25 | 0.10 |" in lines
    assert "| sync | - | 6.25 | 12.50 | 1.00 | - | - |" in lines
    assert "| kg | sync | 2.00 | 0.75 | 4.00 | - | 2.25 |" in lines
    assert ablation.headline({}, speed) == " speedup=2.500 speedup_se=0.500"
    assert ablation.speedups(records[:1]) is None and ablation.speed_table(records[:1]) == []
