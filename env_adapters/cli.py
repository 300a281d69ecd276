"""``agentrl-env``: run the environment stack (controller, workers) and build task images.

Each sub-command lives in its own module that defines ``add_arguments(parser)`` and ``run(args) -> int``;
this file only dispatches, so that ``agentrl-env worker`` never imports what ``controller`` needs.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

COMMANDS = {
    "controller": ("env_adapters.controller", "run the central controller"),
    "worker": ("env_adapters.worker", "run a worker hosting one task"),
    "up": ("env_adapters.up", "start a controller and workers from one YAML; Ctrl-C stops all"),
    "openenv": ("env_adapters.openenv_serve", "serve a running stack's tasks as an OpenEnv environment"),
    "build-images": ("env_adapters.sandbox.images", "build the Docker images of the container tasks (cached)"),
}


def build_parser(
    commands: dict[str, tuple[str, str]], prog: str, description: str, argv: list[str]
) -> argparse.ArgumentParser:
    """Argument parser with one sub-command per entry of ``commands`` (module path, help)."""
    chosen = next((a for a in argv if a in commands), None)
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in commands.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        # Only the chosen command's module is imported (to add its arguments).
        if name == chosen:
            importlib.import_module(module).add_arguments(p)
    return parser


def dispatch(commands: dict[str, tuple[str, str]], prog: str, description: str, argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen sub-command's module."""
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(commands, prog, description, argv).parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,  # importing a command module may already have configured logging (verl does)
    )
    return int(importlib.import_module(args._module).run(args) or 0)


def main(argv: list[str] | None = None) -> int:
    return dispatch(COMMANDS, "agentrl-env", "AgentRL environment stack (AgentBench-FC compatible)", argv)


if __name__ == "__main__":
    sys.exit(main())
