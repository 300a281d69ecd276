"""``agentrl-verl``: the training side (tiny model, datasets, the demo run)."""

from __future__ import annotations

import sys

from env_adapters.cli import dispatch

COMMANDS = {
    "build-tiny-model": ("agentrl_verl.models.tiny", "build (once, cached) the tiny offline model and tokenizer"),
    "make-data": ("agentrl_verl.data", "build verl parquet datasets from the tasks of a controller or a config"),
    "evaluate": ("agentrl_verl.evaluate", "evaluate with each turn drawn from a pool of OpenAI-compatible endpoints"),
    "demo": ("agentrl_verl.demo", "the main job: cold start + AgentRL training of a tiny model on CPU"),
}


def main(argv: list[str] | None = None) -> int:
    return dispatch(COMMANDS, "agentrl-verl", "AgentRL training on verl", argv)


if __name__ == "__main__":
    sys.exit(main())
