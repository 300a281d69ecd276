"""``agentrl-env up CONFIG``: a controller and its workers from one YAML, stopped together by Ctrl-C.

Here (:class:`~env_adapters.launcher.EnvStack`) or on a Ray cluster (``--ray``,
:class:`~env_adapters.ray_stack.RayEnvStack`).
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from env_adapters.launcher import EnvStack, StackStartError

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="stack YAML (see env_adapters/configs/)")
    parser.add_argument("--startup-timeout", type=float, default=120.0)
    parser.add_argument("--log-dir", help="write each process's output to DIR/NAME.log (default: this terminal)")
    parser.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                        help="run every process as a Ray actor on the cluster at ADDRESS (default: the one RAY_ADDRESS "
                        "names, else a new local one), placed by each worker's 'ray' entry")


def run(args: argparse.Namespace) -> int:
    if args.ray is not None:
        from env_adapters.ray_stack import RayEnvStack

        if args.log_dir:
            logger.error("--log-dir and --ray: under Ray each process's output is in Ray's logs (and this terminal)")
            return 2
        stack = RayEnvStack(args.config, address=args.ray or None, startup_timeout=args.startup_timeout)
    else:
        stack = EnvStack(args.config, startup_timeout=args.startup_timeout, log_dir=args.log_dir,
                         inherit=args.log_dir is None)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        stack.start()
    except StackStartError as e:
        logger.error("%s", e)
        return 1
    try:
        logger.info("controller URL: %s (Ctrl-C stops everything)", stack.url)
        while not stop.wait(1.0):
            for label, proc in stack.workers:
                if proc.poll() is not None:
                    logger.error("worker %s exited with code %d; stopping the stack", label, proc.returncode)
                    return 1
            if stack.controller.poll() is not None:
                logger.error("controller exited with code %d; stopping the stack", stack.controller.returncode)
                return 1
        return 0
    finally:
        stack.stop()
