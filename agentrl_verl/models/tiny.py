"""A tiny random Qwen2 model and a ChatML tokenizer, built offline and cached.

No model hub is reachable in CI, so tests and the demo build their own model: a byte-level BPE tokenizer
trained on local text with Qwen2's exact pre-tokenizer (so that ``AutoTokenizer`` reloads it as
``Qwen2Tokenizer`` with identical ids), Qwen2.5-style ChatML with hermes ``<tool_call>`` blocks, and a
randomly initialised ``Qwen2ForCausalLM``. The output directory loads with ``AutoTokenizer`` /
``AutoModelForCausalLM`` and works with verl (``actor_rollout_ref.model.path``).

The chat template renders the tool list compactly (``Tools: name(arg, ...)``) rather than as full JSON
schemas: a model with a few million parameters and short contexts learns far faster from short prompts.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agentrl_verl.models.cache import build_directory, default_cache_dir

logger = logging.getLogger(__name__)

PAD_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = [PAD_TOKEN, "<|im_start|>", "<|im_end|>"]
# Non-special, as in Qwen2.5: they survive decoding with skip_special_tokens=True, so parsers see them.
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
# Qwen2's pre-tokenizer split (digits become single tokens); must match transformers' Qwen2Tokenizer.
QWEN2_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

CHAT_TEMPLATE = (
    "{%- set has_system = messages and messages[0].role == 'system' %}"
    "{%- if tools or has_system %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if has_system %}{{- messages[0].content }}{%- if tools %}{{- '\\n' }}{%- endif %}{%- endif %}"
    "{%- if tools %}{{- 'Tools:' }}{%- for t in tools %}"
    "{{- ' ' + t.function.name + '(' + (t.function.parameters.properties.keys() | join(', ')) + ')' }}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'system' %}"
    "{%- elif m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + m.role + '\\n' + (m.content or '') }}"
    "{%- if m.role == 'assistant' and m.tool_calls %}{%- for tc in m.tool_calls %}"
    "{%- if m.content or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{%- set args = tc.function.arguments %}"
    "{{- '<tool_call>\\n{\"name\": \"' + tc.function.name + '\", \"arguments\": ' }}"
    "{{- (args if args is string else args | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the tiny model; the defaults learn the calculator task on 2 CPU cores in minutes."""

    vocab_size: int = 2048
    hidden_size: int = 192
    num_hidden_layers: int = 3
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = 4096
    seed: int = 0


# Expert episodes the tokenizer is trained on, rendered as the model sees them: (family, task options, indices).
# Their easy settings as the multi-task demo runs them, on training indices (beyond every held-out range). Without
# them these families' text is split into byte-level pieces: kg, webshop and alfworld episodes were 1.4-1.5x longer.
CORPUS_EPISODES: tuple[tuple[str, dict[str, Any], range], ...] = (
    ("calc", {"seed": 0, "size": 5000}, range(1000, 1300)),
    ("kg", {"preset": "easy", "prompt": "short", "size": 400}, range(300, 340)),
    ("webshop", {"preset": "easy", "prompt": "short", "page_size": 3}, range(300, 340)),
    ("alfworld", {"task_types": ["pick_and_place_simple"], "max_receptacles": 3, "distractors": 0, "prompt": "short"},
     range(300, 320)),
)


@functools.cache
def corpus_families() -> tuple[str, ...]:
    """The families of :data:`CORPUS_EPISODES` installed here (``alfworld`` needs its extra: ``.[alfworld]``)."""
    import importlib.util

    families = []
    for family, _, _ in CORPUS_EPISODES:
        if family == "alfworld" and importlib.util.find_spec("alfworld") is None:
            logger.warning("tokenizer corpus: alfworld is not installed (pip install -e '.[alfworld]'); its text is "
                           "left out")
            continue
        families.append(family)
    return tuple(families)


def _corpus(families: Sequence[str]) -> list[str]:
    """Local text for BPE training: the AgentBench OS and DB task descriptions and rendered expert episodes."""
    from importlib import resources

    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from env_adapters.demonstrations import generate_demonstrations

    texts = []
    data = resources.files("env_adapters") / "data" / "agentbench"
    for item in json.loads((data / "os_interaction" / "dev.json").read_text()):
        texts.append(item["description"])
    for line in (data / "dbbench" / "dev.jsonl").read_text().splitlines():
        texts.append(json.loads(line)["description"])
    template = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(CHAT_TEMPLATE)
    for family, options, indices in CORPUS_EPISODES:
        if family in families:
            for episode in generate_demonstrations(family, list(indices), options):
                texts.append(template.render(messages=episode.messages, tools=episode.tools))
    return texts


def build_tokenizer(spec: TinyModelSpec, families: Sequence[str] | None = None):
    """Train the byte-level BPE tokenizer and wrap it as a ``PreTrainedTokenizerFast`` with the chat template.

    Args:
        spec: Vocabulary size.
        families: Task families whose expert episodes are in the corpus (default :func:`corpus_families`).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size - len(TOOL_TOKENS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
    )
    tok.train_from_iterator(_corpus(families if families is not None else corpus_families()), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token=PAD_TOKEN,
        unk_token=None,
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )
    fast.add_tokens(TOOL_TOKENS)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(spec: TinyModelSpec, tokenizer):
    """A randomly initialised ``Qwen2ForCausalLM`` sized by ``spec``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(spec.seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
    )
    return Qwen2ForCausalLM(config)


def _cache_key(spec: TinyModelSpec, families: Sequence[str]) -> str:
    source = Path(__file__).read_bytes()
    blob = json.dumps([asdict(spec), list(families)], sort_keys=True).encode() + source
    return hashlib.sha256(blob).hexdigest()[:12]


def tiny_model_path(cache_dir: str | os.PathLike | None = None, spec: TinyModelSpec | None = None) -> Path:
    """The directory :func:`build_tiny_model` builds (or reuses) for ``spec``, known before it exists."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return root / f"tiny-qwen2-{_cache_key(spec or TinyModelSpec(), corpus_families())}"


def build_tiny_model(cache_dir: str | os.PathLike | None = None, spec: TinyModelSpec | None = None) -> Path:
    """Build (or reuse) the tiny model and tokenizer and return their directory.

    The directory name carries a hash of ``spec``, of this file and of the task families in the tokenizer's corpus,
    so a change to any of them builds anew.
    The build writes to a temporary directory and renames it, so concurrent callers never see half a model.

    Args:
        cache_dir: Where models are kept (default :func:`default_cache_dir`).
        spec: Model shape and seed.

    Returns:
        The model directory (``config.json``, weights, ``tokenizer.json``, chat template).
    """
    spec = spec or TinyModelSpec()
    target = tiny_model_path(cache_dir, spec)
    if (target / "config.json").exists():
        return target
    logger.info("building tiny model and tokenizer in %s", target)
    tokenizer = build_tokenizer(spec, corpus_families())
    model = build_model(spec, tokenizer)

    def save(directory: Path) -> None:
        tokenizer.save_pretrained(directory)
        model.save_pretrained(directory)
        _check_reload(directory, tokenizer)

    build_directory(target, save)
    n_params = sum(p.numel() for p in model.parameters())
    logger.info("tiny model ready: %s (%.2fM parameters, vocab %d)", target, n_params / 1e6, len(tokenizer))
    return target


def _check_reload(path: Path, tokenizer) -> None:
    """Fail loudly if ``AutoTokenizer`` reloads the tokenizer with different ids (the Qwen2Tokenizer trap)."""
    from transformers import AutoTokenizer

    sample = '<|im_start|>user\nWhat is 37 plus 48?<|im_end|>\n<tool_call>\n{"name": "x"}\n</tool_call>'
    reloaded = AutoTokenizer.from_pretrained(path)
    if reloaded(sample)["input_ids"] != tokenizer(sample)["input_ids"]:
        raise RuntimeError(f"tokenizer ids change after reload from {path}; the pre-tokenizer no longer matches")
