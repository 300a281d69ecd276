"""``agentrl-verl``: the training side (model directories, datasets, evaluation, the demo run)."""

from __future__ import annotations

import logging
import sys

from env_adapters.cli import dispatch

COMMANDS = {
    "build-model": ("agentrl_verl.tools.build_model", "build (once, cached) a model directory: tiny, smollm2"),
    "make-data": ("agentrl_verl.tools.data", "build verl parquet datasets from the tasks of a controller or a config"),
    "evaluate": ("agentrl_verl.tools.evaluate",
                 "evaluate with each turn drawn from a pool of OpenAI-compatible endpoints"),
    "demo": ("agentrl_verl.harness.demo", "the main job: cold start + AgentRL training of a tiny model on CPU"),
}


QUIET_LOGGERS = ("verl.utils.tokenizer.continuous_token_wiring",)
"""verl loggers that report routine steps at INFO once per episode; the commands show their WARNINGs only."""


def main(argv: list[str] | None = None) -> int:
    # verl's import-time warnings about optional GPU engines are silenced where they arise, by the CPU platform.
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    return dispatch(COMMANDS, "agentrl-verl", "AgentRL training on verl", argv)


if __name__ == "__main__":
    sys.exit(main())
