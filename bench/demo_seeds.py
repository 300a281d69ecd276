"""The demo over several seeds, pooled: ``python -m bench.demo_seeds --config PRESET --seeds 0 1 2 3 --out DIR``.

One demo run's per-family changes of held-out success are within the evaluation's noise, so whether RL raises
held-out success is judged over seeds. For each seed S, ``DIR/seed_S`` holds one ``agentrl-verl demo --config PRESET
--set seed=S --set warmup.seed=S [--set KEY=VALUE ...]`` run (its output in ``demo.log`` there). The seeds run one
after another (each takes the whole CPU), or ``--parallel P`` at once on a machine with more cores (``--pin``: each on
an equal share of them); a folder that already holds a finished run of the same settings is reused, one made with
other settings is refused, and a run that stopped early is run again. ``--report`` runs nothing and summarises the
finished runs of ``--seeds`` under ``DIR``.

``DIR/summary.md`` and ``DIR/summary.json`` hold, per family and evaluation mode (greedy, sampled): each seed's
held-out success before -> after RL and its change, with the run's total time; pooled over seeds, the mean success
before and after, the mean change +- its standard error over seeds, and the held-out indices that went up (fail ->
success) and down (success -> fail) pooled over every seed's episodes, with the one-sided exact sign test on them
(:mod:`agentrl_verl.tools.compare`); and per seed how many families rose (change > 0), with how many seeds had at
least :data:`FAMILIES_UP` families rise. The last line printed is ``key=value`` pairs: per family and mode the mean
change, its standard error and the p-value, then the seeds and how many of them had :data:`FAMILIES_UP` families
rise in each mode.

Results and how to read them: ``docs/demo.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl_verl.pipeline.settings import PipelineConfig, load_pipeline_config
from agentrl_verl.presets import CONFIG_DIR
from agentrl_verl.tools.compare import paired_changes, sign_test_p
from bench.common import mean_and_se, run_processes

logger = logging.getLogger("bench.demo_seeds")

MODES = ("greedy", "sampled")
"""The demo's evaluation modes (``sampled`` unless ``eval.sampled=false``)."""
FAMILIES_UP = 3
"""The claim judged per seed: RL raises held-out success on at least this many families."""
SEED_KEYS = ("seed", "warmup.seed")
"""The settings each seed sets (``--set`` may not)."""
LOG = "demo.log"
"""A run's output (the demo's stdout and stderr) in its folder."""
STOP_S = 120
"""Seconds a demo gets to stop its environment stack and verl run after SIGTERM (then SIGKILL)."""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(Path(CONFIG_DIR) / "demo_multitask.yaml"),
                        help="demo settings YAML (default: the multi-task preset, demo_multitask.yaml)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3], help="one demo run per seed")
    parser.add_argument("--out", required=True, help="folder of the runs (seed_S/) and the summary")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a demo setting of every run, as `agentrl-verl demo --set` (repeatable)")
    parser.add_argument("--parallel", type=int, default=1, help="demo runs at once, each in its own process")
    parser.add_argument("--pin", action="store_true",
                        help="give each of the --parallel runs an equal share of the CPUs this process may use")
    parser.add_argument("--report", action="store_true", help="run nothing: summarise the finished runs under --out")
    args = parser.parse_args(argv)
    if args.parallel < 1:
        parser.error(f"--parallel {args.parallel}: must be >= 1")
    if args.pin and not hasattr(os, "sched_setaffinity"):
        parser.error("--pin needs CPU affinity (Linux)")
    for override in args.overrides:
        if override.partition("=")[0] in SEED_KEYS:
            parser.error(f"--set {override}: each run's {' and '.join(SEED_KEYS)} are its seed (--seeds)")
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds {args.seeds}: each seed once")
    return args


# ---- one seed -----------------------------------------------------------------------------------------


def seed_overrides(seed: int) -> list[str]:
    """The demo settings of seed ``seed``: the run's seed (data order, sampling) and the warm-up's."""
    return [f"{key}={seed}" for key in SEED_KEYS]


def expected_config(config: str, overrides: Sequence[str], seed: int) -> dict[str, Any]:
    """The ``config`` that seed ``seed``'s ``summary.json`` holds when made with these settings (validated)."""
    loaded = load_pipeline_config(config, [*seed_overrides(seed), *overrides])
    return json.loads(json.dumps(dataclasses.asdict(loaded), default=str))  # as the demo writes it


def differences(saved: Any, expected: Any, key: str = "", default: Any = None) -> list[str]:
    """The dotted keys where ``saved`` and ``expected`` (JSON values) differ. A key ``saved`` lacks is no difference
    where ``expected`` holds that setting's ``default`` value: the run was made before the setting existed."""
    if isinstance(saved, dict) and isinstance(expected, dict):
        default = default if isinstance(default, dict) else {}
        return [d for k in sorted(saved.keys() | expected.keys(), key=str)
                if k in saved or k not in default or default[k] != expected.get(k)
                for d in differences(saved.get(k), expected.get(k), f"{key}.{k}" if key else str(k), default.get(k))]
    if isinstance(saved, list) and isinstance(expected, list) and len(saved) == len(expected):
        return [d for i, (s, e) in enumerate(zip(saved, expected, strict=True))
                for d in differences(s, e, f"{key}.{i}" if key else str(i))]
    return [] if saved == expected else [key]


def saved_run(folder: Path, expected: dict[str, Any]) -> dict[str, Any] | None:
    """The ``summary.json`` of the demo run in ``folder`` (None: no summary there).

    Raises:
        ValueError: the run was made with other settings than ``expected``.
    """
    path = folder / "summary.json"
    if not path.exists():
        return None
    summary = json.loads(path.read_text())
    defaults = json.loads(json.dumps(dataclasses.asdict(PipelineConfig()), default=str))
    changed = differences(summary.get("config"), expected, default=defaults)
    if changed:
        raise ValueError(f"{folder} holds a demo run made with other settings ({', '.join(changed[:8])} differ): "
                         "use another --out, or the settings of that run")
    return summary


def demo_command(config: str, seed: int, overrides: Sequence[str], folder: Path) -> list[str]:
    """The demo's command line of seed ``seed`` (its CLI module, so that no console script is needed)."""
    sets = [arg for override in (*seed_overrides(seed), *overrides) for arg in ("--set", override)]
    return [sys.executable, "-m", "agentrl_verl.tools.cli", "demo", "--config", config, *sets,
            "--output-dir", str(folder)]


def pending_seed(args: argparse.Namespace, seed: int, folder: Path) -> dict[str, Any] | None:
    """Seed ``seed``'s finished demo run in ``folder`` if there is one; else None, with ``folder`` ready for a new run
    (a run that stopped early is removed).

    Raises:
        ValueError: ``folder`` holds a run of other settings, or files but no demo summary (a run in progress?).
    """
    summary = saved_run(folder, expected_config(str(Path(args.config).resolve()), args.overrides, seed))
    if summary is not None and summary["status"] == "finished":
        logger.info("seed %d: reusing the finished run in %s", seed, folder)
        return summary
    if summary is not None:
        logger.warning("seed %d: the run in %s stopped early (%s): running it again", seed, folder,
                       summary.get("stopped_because"))
        shutil.rmtree(folder)
    elif folder.exists() and any(path.name != LOG for path in folder.iterdir()):  # the log alone: a failed start
        raise ValueError(f"{folder} holds files but no demo summary (a run still going, or one killed): remove it "
                         "to run that seed again")
    folder.mkdir(parents=True, exist_ok=True)
    return None


def run_seeds(args: argparse.Namespace, out: Path) -> dict[int, dict[str, Any]]:
    """Every seed's finished demo run under ``out``: those there, and new runs of the others (``--parallel`` at once;
    a new run's output goes to :data:`LOG` in its folder).

    Raises:
        ValueError: a folder holds a run of other settings, or files but no demo summary.
        RuntimeError: a demo failed (after every other run has ended; the finished ones are kept for the next call).
    """
    config = str(Path(args.config).resolve())
    summaries, commands = {}, {}
    for seed in args.seeds:
        folder = out / f"seed_{seed}"
        summary = pending_seed(args, seed, folder)
        if summary is not None:
            summaries[seed] = summary
        else:
            commands[f"seed {seed}"] = (demo_command(config, seed, args.overrides, folder), folder / LOG)
    if commands:
        logger.info("running %d demo run(s), %d at once: %s", len(commands), args.parallel, ", ".join(commands))
    failed = run_processes(commands, args.parallel, args.pin, STOP_S)
    if failed:
        raise RuntimeError("the demo failed for " + "; ".join(f"{name} (see {commands[name][1]})" for name in failed))
    for seed in (seed for seed in args.seeds if seed not in summaries):
        summaries[seed] = json.loads((out / f"seed_{seed}" / "summary.json").read_text())
        logger.info("seed %d: finished in %.0fs", seed, summaries[seed]["timings_s"]["total_s"])
    return {seed: summaries[seed] for seed in args.seeds}


def seed_record(seed: int, folder: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """One seed's numbers: the run's total time and per family its held-out episodes and, per evaluation mode,
    success before and after RL, the change, and the indices that went up and down."""
    pairs = paired_changes(folder)
    tasks = {}
    for family, row in summary["tasks"].items():
        tasks[family] = {"held_out": row["held_out"]}
        for mode in MODES:
            if mode in row:
                r = row[mode]
                up, down = pairs[family, mode]
                tasks[family][mode] = {"before": r["success_before"], "after": r["success_after"],
                                       "change": r["success_change"], "up": up, "down": down}
    return {"seed": seed, "folder": folder.name, "total_s": summary["timings_s"]["total_s"], "tasks": tasks}


# ---- over seeds ---------------------------------------------------------------------------------------


def seed_statistics(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Over the seeds' records: the families and modes every seed has, per family and mode the pooled numbers
    (mean before and after, mean change and its standard error over seeds, pairs up and down over every seed's
    episodes and their sign test), and per mode the families that rose in each seed and the seeds where at least
    :data:`FAMILIES_UP` did."""
    families = [f for f in records[0]["tasks"] if all(f in r["tasks"] for r in records)]
    modes = [m for m in MODES if all(m in r["tasks"][f] for r in records for f in families)]
    pooled: dict[str, dict[str, Any]] = {}
    for family in families:
        pooled[family] = {}
        for mode in modes:
            rows = [r["tasks"][family][mode] for r in records]
            up, down = sum(row["up"] for row in rows), sum(row["down"] for row in rows)
            pooled[family][mode] = {
                "episodes": sum(r["tasks"][family]["held_out"] for r in records),
                "before": mean_and_se([row["before"] for row in rows])[0],
                "after": mean_and_se([row["after"] for row in rows])[0],
                "change": mean_and_se([row["change"] for row in rows]), "up": up, "down": down,
                "p": sign_test_p(up, down)}
    rose = {mode: {r["seed"]: [f for f in families if r["tasks"][f][mode]["change"] > 0] for r in records}
            for mode in modes}
    return {"seeds": [r["seed"] for r in records], "families": families, "modes": modes, "pooled": pooled,
            "rose": rose, "seeds_up": {mode: sum(len(up) >= FAMILIES_UP for up in rose[mode].values())
                                       for mode in modes}}


def describe(config: PipelineConfig, path: str, overrides: Sequence[str] = ()) -> str:
    """The runs' settings in a sentence, with the ``--set`` overrides they share."""
    modes = "greedy and sampled" if config.eval.sampled else "greedy"
    held_out = sorted({t.held_out for t in config.tasks})
    sets = f" with {', '.join(f'`--set {o}`' for o in overrides)}" if overrides else ""
    return (f"Settings {Path(path).name}{sets} ({', '.join(t.name for t in config.tasks)}), one run per seed "
            f"(`seed` and `warmup.seed`); each run evaluates {' / '.join(map(str, held_out))} held-out indices per "
            f"family before and after {config.rl.steps} RL steps, {modes}"
            f"{f' (temperature {config.eval.temperature:g})' if config.eval.sampled else ''}.")


def summary_markdown(records: Sequence[dict[str, Any]], stats: dict[str, Any], settings: str) -> str:
    """The report: the pooled table, the families that rose per seed, and each seed's numbers."""
    families, modes, n = stats["families"], stats["modes"], len(records)
    seeds = ", ".join(map(str, stats["seeds"]))
    lines = ["# bench.demo_seeds", "", settings, "", f"## Pooled over {n} seeds ({seeds})", "",
             "| family | eval | episodes | before | after | change +- s.e. | pairs up / down | p |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for family in families:
        for mode in modes:
            s = stats["pooled"][family][mode]
            lines.append(f"| {family} | {mode} | {s['episodes']} | {s['before']:.3f} | {s['after']:.3f} "
                         f"| {s['change'][0]:+.3f} +- {s['change'][1]:.3f} | {s['up']} / {s['down']} | {s['p']:.3g} |")
    lines += ["", "before / after: mean over seeds of each run's held-out success; change: its mean +- standard error "
              "over seeds; episodes: held-out episodes over all seeds (each index evaluated before and after RL in "
              "each mode); pairs: those indices that went fail -> success / success -> fail; p: one-sided exact "
              "sign test that as many ups or more come by chance (McNemar's test).", "",
              "## Families that rose (change > 0)", "",
              f"| seed | total s | {' | '.join(modes)} |", "| --- | --- |" + " --- |" * len(modes)]
    for r in records:
        cells = [f"{len(up)}/{len(families)} ({', '.join(up) or '-'})"
                 for up in (stats["rose"][mode][r["seed"]] for mode in modes)]
        lines.append(f"| {r['seed']} | {r['total_s']:.0f} | {' | '.join(cells)} |")
    lines += ["", f"Seeds with at least {FAMILIES_UP} of {len(families)} families up: "
              + ", ".join(f"{mode} {stats['seeds_up'][mode]}/{n}" for mode in modes) + ".", "", "## Per seed", "",
              f"| seed | family | held-out | {' | '.join(modes)} |", "| --- | --- | --- |" + " --- |" * len(modes)]
    for r in records:
        for family in families:
            cells = [f"{m['before']:.3f} -> {m['after']:.3f} ({m['change']:+.3f}; {m['up']} up, {m['down']} down)"
                     for m in (r["tasks"][family][mode] for mode in modes)]
            lines.append(f"| {r['seed']} | {family} | {r['tasks'][family]['held_out']} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def headline(stats: dict[str, Any]) -> str:
    """The last line: per family and mode the mean change, its standard error and p; the seeds and, per mode, how
    many had :data:`FAMILIES_UP` families rise."""
    values = [f"{family}_{mode}_change={s['change'][0]:.3f} {family}_{mode}_se={s['change'][1]:.3f} "
              f"{family}_{mode}_p={s['p']:.3g}" for family, per_mode in stats["pooled"].items()
              for mode, s in per_mode.items()]
    ups = [f"seeds_{FAMILIES_UP}_up_{mode}={count}" for mode, count in stats["seeds_up"].items()]
    return " ".join([*values, f"seeds={len(stats['seeds'])}", *ups])


# ---- the command --------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", force=True)
    args = parse_args(argv)
    # A timeout's SIGTERM unwinds like Ctrl-C: the running demo gets it too and stops what it started.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    out = Path(args.out).resolve()
    records = []
    if args.report:
        for seed in args.seeds:
            folder = out / f"seed_{seed}"
            summary = saved_run(folder, expected_config(args.config, args.overrides, seed))
            if summary is None or summary["status"] != "finished":
                logger.info("seed %d: no finished run in %s", seed, folder)
                continue
            records.append(seed_record(seed, folder, summary))
    else:
        records = [seed_record(seed, out / f"seed_{seed}", summary) for seed, summary in run_seeds(args, out).items()]
    if not records:
        raise SystemExit(f"no finished demo run under {out} for seeds {args.seeds}")
    stats = seed_statistics(records)
    settings = describe(load_pipeline_config(args.config, args.overrides), args.config, args.overrides)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps({"settings": settings, "stats": stats, "runs": records}, indent=2))
    text = summary_markdown(records, stats, settings)
    (out / "summary.md").write_text(text)
    print(text)
    print(f"out={out}")
    print(headline(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
