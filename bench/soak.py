"""Hours of load on the environment stack: after the first minutes, does anything grow?

A stack (controller and one worker per family, as ``agentrl-env up`` starts them) of every family that runs on this
machine: ``calc``, ``kg`` (on a Virtuoso server the task starts, where ``virtuoso-t`` is installed), ``db`` (on a
MariaDB server the task starts, where ``mariadbd`` is installed), ``os`` (where Docker answers), ``alfworld`` and
``webshop``. ``--concurrency`` session loops per family keep it at its configured concurrency for ``--duration``
seconds, each session played by one of three scripted policies, drawn at random (seeded):

- ``good``: the family's scripted expert (``Task.expert``, computed here from the same items), or for ``os``, which
  has none, a few harmless commands and an answer;
- ``malformed``: unparsable arguments, an unknown tool, then plain text: the errors agents make;
- ``abandoned``: one interact, then nothing: the controller's idle timeout (``--idle-timeout``) ends the session.

Every ``--sample-every`` seconds it records, per process tree (controller; each worker with its children: the
Virtuoso and MariaDB servers, the kg store processes), resident memory, open files and threads; the stack's
containers; the MariaDB server's databases; this machine's temporary files of the stack; and interacts per second
since the last sample. The report (``--out``: ``report.json`` with every sample, ``report.md``) gives, per series,
the least-squares slope per hour over the samples after ``--settle`` seconds and the slope's standard error: a series
grows where its slope is more than three standard errors above zero and adds more than ``--tolerance`` of its mean
per hour.

Usage::

    python -m bench.soak [--duration 3600] [--sample-every 60] [--settle 300] [--concurrency 4]
        [--families calc,kg,db,os,alfworld,webshop] [--out bench/results/soak]

Results and how to read them: ``docs/environments/soak.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import random
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from env_adapters.client import EnvClient
from env_adapters.launcher import EnvStack
from env_adapters.protocol import Message
from env_adapters.sandbox.containers import LABEL_SANDBOX
from env_adapters.sandbox.mariadb import DIR_PREFIX as MARIADB_PREFIX
from env_adapters.task import Task, get_task_class
from env_adapters.tasks.dbbench.backends import DB_PREFIX

logger = logging.getLogger("bench.soak")

POLICIES = {"good": 0.5, "malformed": 0.3, "abandoned": 0.2}
MAX_TURNS = 12


def available_families() -> dict[str, dict[str, Any]]:
    """Each family that can run here, with its worker options."""
    families: dict[str, dict[str, Any]] = {
        "calc": {"size": 1000},
        "kg": {"size": 200, "backend": "virtuoso"} if shutil.which("virtuoso-t") else {"size": 200},
        "db": {"backend": "mysql"} if shutil.which("mariadbd") else {},
        "alfworld": {},
        "webshop": {"preset": "easy"},
    }
    try:
        import docker

        docker.from_env().ping()
        families["os"] = {"split": "dev", "pool_size": 2}
    except Exception as error:  # no daemon, no permission: the family is left out and the report says so
        logger.warning("os left out: Docker does not answer (%s)", error)
    return families


# ---- policies ----------------------------------------------------------------------------------------------


def call(name: str, arguments: str, turn: int) -> Message:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": f"c{turn}", "type": "function", "function": {"name": name, "arguments": arguments}}]}


def os_action(turn: int) -> Message:
    """A few harmless commands, then an answer (the task's own tool names)."""
    if turn < 3:
        return call("bash_action", json.dumps({"script": ["ls /", "echo soak", "cat /etc/hostname"][turn]}), turn)
    return call("answer_action", json.dumps({"answer": "0"}), turn)


def malformed_action(tools: list[dict], turn: int) -> Message:
    name = tools[0]["function"]["name"] if tools else "unknown"
    return [call(name, "{not json", turn), call("no_such_tool", "{}", turn),
            {"role": "assistant", "content": "I am not sure."}][turn % 3]


class NoExpert(Exception):
    """The family's expert cannot play this item (e.g. a ``db`` item without a reference statement)."""


async def play(env: EnvClient, family: str, shadow: Task | None, index: Any, policy: str) -> int:
    """One session of ``policy``; returns its interacts.

    Raises:
        NoExpert: ``good`` on an item its expert cannot play (the session is cancelled first).
    """
    session = await env.start_sample(family, index)
    messages, tools, interacts = list(session.messages), list(session.tools or []), 0
    finished = session.finished
    while not finished and interacts < MAX_TURNS:
        if policy == "abandoned" and interacts == 1:
            return interacts  # never closed: the controller's idle timeout ends it
        if policy == "malformed":
            action = malformed_action(tools, interacts)
        elif shadow is not None:
            try:
                action = shadow.expert(index, messages)
            except (KeyError, IndexError, StopIteration, ValueError) as error:
                await env.cancel(session.session_id)
                raise NoExpert(f"{family} {index}: {error!r}") from error
        else:
            action = os_action(interacts)
        reply = await env.interact(session.session_id, action)
        interacts += 1
        messages += [action, *reply.messages]
        finished = reply.finish
    if not finished:
        await env.cancel(session.session_id)
    return interacts


async def drive(url: str, families: dict[str, dict[str, Any]], concurrency: int, duration: float, seed: int,
                counter: list[int]) -> None:
    """``concurrency`` session loops per family until ``duration`` has passed; ``counter`` counts the interacts and
    the sessions that failed."""
    shadows = {family: None if family == "os" else get_task_class(family)(**options)
               for family, options in families.items()}
    async with EnvClient(url) as env:
        indices = {family: await env.get_indices(family) for family in families}
        stop_at = time.monotonic() + duration

        no_expert: dict[str, set] = {family: set() for family in families}

        async def loop(family: str, rng: random.Random) -> None:
            while time.monotonic() < stop_at:
                policy = rng.choices(list(POLICIES), weights=list(POLICIES.values()))[0]
                index = rng.choice(indices[family])
                if policy == "good" and index in no_expert[family]:
                    continue
                try:
                    interacts = await play(env, family, shadows[family], index, policy)
                except NoExpert:
                    no_expert[family].add(index)
                    continue
                except Exception as error:  # a failed session is counted by the stack, not fatal to the soak
                    counter[1] += 1
                    logger.warning("%s session (%s) failed: %s", family, policy, error)
                    continue
                counter[0] += interacts

        await asyncio.gather(*(loop(family, random.Random(f"{seed}-{family}-{i}"))
                               for family in families for i in range(concurrency)))


# ---- samples -----------------------------------------------------------------------------------------------


def tree_usage(pid: int) -> dict[str, float]:
    """Resident MiB, open files and threads of a process and its descendants."""
    rss = fds = threads = 0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {"rss_mib": 0.0, "open_files": 0.0, "threads": 0.0}
    for proc in procs:
        try:
            with proc.oneshot():
                rss += proc.memory_info().rss
                fds += proc.num_fds()
                threads += proc.num_threads()
        except psutil.NoSuchProcess:
            continue
    return {"rss_mib": rss / 2**20, "open_files": float(fds), "threads": float(threads)}


def stack_containers() -> float:
    """The sandbox's containers (NaN where Docker does not answer: the sample has no value then)."""
    try:
        import docker

        client = docker.from_env()
        try:
            # sparse: no inspection of each container, which fails for one removed meanwhile
            return float(len(client.containers.list(all=True, sparse=True, filters={"label": LABEL_SANDBOX})))
        finally:
            client.close()
    except Exception as error:
        logger.warning("containers not counted: %r", error)
        return float("nan")


def names(folder: Path, prefix: str) -> list[str]:
    """Names in ``folder`` that start with ``prefix`` (none where the folder is gone: the stack changes it)."""
    try:
        return [name for name in os.listdir(folder) if name.startswith(prefix)]
    except OSError:
        return []


def stack_temp_entries(pids: set[int]) -> list[Path]:
    """Entries of the temporary folder made by the stack's processes: named ``agentrl-KIND-PID-...`` after their
    owner (servers' folders, the kg store's files), so other stacks on the machine are not counted."""
    temp = Path(tempfile.gettempdir())
    return [temp / name for name in names(temp, "agentrl-") if any(f"-{pid}-" in name for pid in pids)]


def size_mib(path: Path) -> float:
    """Bytes under ``path``, in MiB; files that go meanwhile count 0."""
    total = 0
    for folder, _, files in os.walk(path, onerror=lambda error: None):  # a folder removed meanwhile is skipped
        for name in files:
            try:
                total += os.stat(os.path.join(folder, name)).st_size
            except OSError:
                continue
    if not total and path.is_file():
        with contextlib.suppress(OSError):
            total = path.stat().st_size
    return total / 2**20


def sample(stack: EnvStack, interacts_per_s: float) -> dict[str, float]:
    """One sample of every series."""
    row: dict[str, float] = {"interacts_per_s": interacts_per_s}
    for label, proc in [("controller", stack.controller), *stack.workers]:
        for name, value in tree_usage(proc.pid).items():
            row[f"{label}/{name}"] = value
    pids = {proc.pid for _, proc in stack.workers}
    entries = stack_temp_entries(pids)
    row["containers"] = stack_containers()
    row["mariadb_databases"] = float(sum(len(names(p / "data", DB_PREFIX)) for p in entries
                                         if p.name.startswith(MARIADB_PREFIX)))
    row["temp_entries"] = float(len(entries))
    row["temp_mib"] = sum(size_mib(p) for p in entries)
    return row


# ---- report ------------------------------------------------------------------------------------------------


def slope_per_hour(times: list[float], values: list[float]) -> tuple[float, float]:
    """Least-squares slope of ``values`` over ``times`` (seconds), per hour, and its standard error."""
    n = len(times)
    if n < 3:
        return float("nan"), float("nan")
    mt, mv = sum(times) / n, sum(values) / n
    sxx = sum((t - mt) ** 2 for t in times)
    slope = sum((t - mt) * (v - mv) for t, v in zip(times, values, strict=True)) / sxx
    residual = sum((v - mv - slope * (t - mt)) ** 2 for t, v in zip(times, values, strict=True))
    se = math.sqrt(residual / (n - 2) / sxx)
    return slope * 3600, se * 3600


def report(samples: list[dict[str, float]], settle: float, tolerance: float) -> dict[str, dict[str, float | bool]]:
    """Per series: mean, slope per hour and its standard error over the samples after ``settle``, and whether it
    grows (see the module docstring)."""
    kept = [s for s in samples if s["t"] >= settle]
    out = {}
    for name in sorted(k for k in samples[0] if k != "t"):
        points = [(s["t"], s[name]) for s in kept if not math.isnan(s.get(name, float("nan")))]
        if not points:
            continue
        times, values = [t for t, _ in points], [v for _, v in points]
        slope, se = slope_per_hour(times, values)
        mean = sum(values) / len(values)
        grows = slope > 3 * se and slope > tolerance * max(abs(mean), 1e-9)
        out[name] = {"mean": mean, "first": values[0], "last": values[-1], "slope_per_hour": slope,
                     "slope_se": se, "grows": bool(grows)}
    return out


def markdown(summary: dict[str, Any]) -> str:
    lines = [f"# Soak: {summary['duration_s'] / 60:.0f} minutes, families {', '.join(summary['families'])}", "",
             f"Command: `{summary['command']}`", "",
             f"Sessions: {summary['interacts']} interacts, {summary['failed_sessions']} sessions failed on the client "
             f"side; series fitted after the first {summary['settle_s']:.0f} s ({summary['samples_fitted']} samples).",
             "", "| series | mean | first | last | slope per hour | its standard error | grows |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, s in summary["series"].items():
        lines.append(f"| {name} | {s['mean']:.2f} | {s['first']:.2f} | {s['last']:.2f} | {s['slope_per_hour']:+.3f} | "
                     f"{s['slope_se']:.3f} | {'**yes**' if s['grows'] else 'no'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import sys

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=3600.0)
    parser.add_argument("--sample-every", type=float, default=60.0)
    # The controller keeps finished sessions for finished_ttl (600 s): its memory rises until they start to expire.
    parser.add_argument("--settle", type=float, default=900.0, help="seconds before the fitted samples")
    parser.add_argument("--concurrency", type=int, default=4, help="session loops per family")
    parser.add_argument("--families", default=None, help="comma-separated (default: all that run here)")
    parser.add_argument("--idle-timeout", type=float, default=30.0, help="the controller's session_idle_timeout")
    parser.add_argument("--tolerance", type=float, default=0.05, help="growth per hour, as a share of the mean")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench/results/soak"))
    parser.add_argument("--reanalyse", type=Path, default=None, metavar="REPORT_JSON",
                        help="fit the samples of an earlier run's report.json again (--settle, --tolerance) and write "
                             "the report to --out; runs nothing")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.reanalyse is not None:
        return write_report(json.loads(args.reanalyse.read_text()), args)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # as Ctrl-C: the stack stops, the report is written
    families = available_families()
    if args.families:
        unknown = set(args.families.split(",")) - set(families)
        if unknown:
            parser.error(f"--families: {sorted(unknown)} cannot run here or are unknown; these can: {sorted(families)}")
        families = {f: families[f] for f in args.families.split(",")}
    # Room for the abandoned sessions, which hold their slot until the idle timeout ends them.
    workers = [{"task": family, "name": family, "concurrency": 4 * args.concurrency, "options": options}
               for family, options in families.items()]
    controller = {"port": 0, "session_idle_timeout": args.idle_timeout, "clean_interval": min(10.0, args.idle_timeout)}
    samples: list[dict[str, float]] = []
    counter = [0, 0]  # interacts, failed sessions
    with EnvStack({"controller": controller, "workers": workers}, startup_timeout=600) as stack:
        logger.info("stack up at %s: %s", stack.url, ", ".join(families))

        async def run() -> None:
            driver = asyncio.create_task(drive(stack.url, families, args.concurrency, args.duration, args.seed,
                                               counter))
            start = last_t = time.monotonic()
            last_n = 0
            while not driver.done():
                await asyncio.wait([driver], timeout=args.sample_every)
                now = time.monotonic()
                rate = (counter[0] - last_n) / max(now - last_t, 1e-9)
                last_t, last_n = now, counter[0]
                try:
                    row = {"t": now - start, **sample(stack, rate)}
                except Exception:  # the soak outlives a sample it could not take (it is missing from the fit)
                    logger.exception("sample at %.0f s failed", now - start)
                    continue
                samples.append(row)
                logger.info("%.0f s: %.1f interacts/s, controller %.0f MiB, containers %s, temp entries %.0f",
                            row["t"], rate, row["controller/rss_mib"], row["containers"], row["temp_entries"])
            await driver

        try:
            asyncio.run(run())
        except KeyboardInterrupt:
            logger.warning("interrupted after %d samples: the report covers them", len(samples))
    if not samples:
        logger.error("no sample was taken: nothing to report")
        return 1
    command = "python -m bench.soak " + " ".join(sys.argv[1:] if argv is None else argv)
    summary = {"command": command, "duration_s": samples[-1]["t"], "families": list(families),
               "interacts": counter[0], "failed_sessions": counter[1], "samples": samples}
    return write_report(summary, args)


def write_report(summary: dict[str, Any], args: argparse.Namespace) -> int:
    """Fit the series of ``summary``'s samples (``args.settle``, ``args.tolerance``), write the report to
    ``args.out`` and print it with the series that grew."""
    samples = summary["samples"]
    series = report(samples, args.settle, args.tolerance)
    summary = {**summary, "settle_s": args.settle, "samples_fitted": sum(s["t"] >= args.settle for s in samples),
               "series": series}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(summary, indent=1))
    (args.out / "report.md").write_text(markdown(summary))
    print(markdown(summary))
    grown = [name for name, s in series.items() if s["grows"] and name != "interacts_per_s"]
    print(f"growing series: {grown or 'none'}")
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
