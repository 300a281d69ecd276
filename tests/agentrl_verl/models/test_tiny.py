"""The offline tiny model: reloads with the same ids, renders tool calls, and is cached."""

import json

from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl_verl.models.tiny import TinyModelSpec, build_tiny_model, tiny_model_path

TOOLS = [
    {"type": "function", "function": {"name": "calculate", "parameters": {"properties": {"expression": {}}}}},
    {"type": "function", "function": {"name": "submit", "parameters": {"properties": {"answer": {}}}}},
]


def test_cached_build_returns_same_directory(model_dir):
    assert build_tiny_model() == model_dir


def test_the_directory_is_known_before_the_build(model_dir, tmp_path):
    assert tiny_model_path() == model_dir
    other = tiny_model_path(tmp_path, TinyModelSpec(seed=1))
    assert other.parent == tmp_path and other.name != model_dir.name and not other.exists()


def test_tokenizer_and_model_load_offline(model_dir):
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert tok.eos_token == "<|im_end|>"
    assert model.config.eos_token_id == tok.eos_token_id
    assert model.config.vocab_size == len(tok)
    # Digits are single tokens (Qwen2 split), so arithmetic stays learnable.
    assert len(tok("1234", add_special_tokens=False)["input_ids"]) == 4
    for t in ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<|im_start|>"):
        assert len(tok(t, add_special_tokens=False)["input_ids"]) == 1, t


def test_chat_template_renders_tools_calls_and_responses(model_dir):
    tok = AutoTokenizer.from_pretrained(model_dir)
    call = {"id": "c0", "type": "function", "function": {"name": "calculate", "arguments": '{"expression": "1+2"}'}}
    messages = [
        {"role": "user", "content": "What is 1 plus 2?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c0", "content": "3"},
    ]
    text = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nTools: calculate(expression) submit(answer)<|im_end|>\n"
        "<|im_start|>user\nWhat is 1 plus 2?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "calculate", "arguments": {"expression": "1+2"}}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # The tool call block is valid JSON between the markers (what hermes parsers expect).
    body = text.split("<tool_call>\n")[1].split("\n</tool_call>")[0]
    assert json.loads(body) == {"name": "calculate", "arguments": {"expression": "1+2"}}


def test_tokenizer_renders_the_families_compactly(tokenizer):
    """The corpus holds the families' episodes: their text gets merges of its own rather than byte-level pieces
    (with generic text only: 2.2-2.9 bytes a token on these episodes)."""
    from agentrl_verl.models.tiny import CORPUS_EPISODES, corpus_families
    from agentrl_verl.pipeline.cold_start import render_conversation
    from env_adapters.demonstrations import generate_demonstrations

    for family, options, indices in CORPUS_EPISODES:
        if family not in corpus_families():
            continue
        for episode in generate_demonstrations(family, range(indices.stop, indices.stop + 2), options):
            text = render_conversation(tokenizer, episode.messages, episode.tools, add_generation_prompt=False)
            assert len(text.encode()) / len(tokenizer.encode(text)) > 3.1, (family, episode.index)


def test_hermes_parser_extracts_generated_calls(model_dir):
    import asyncio

    from verl.experimental.agent_loop.tool_parser import ToolParser

    tok = AutoTokenizer.from_pretrained(model_dir)
    parser = ToolParser.get_tool_parser("hermes", tok)
    ids = tok('<tool_call>\n{"name": "submit", "arguments": {"answer": "3"}}\n</tool_call><|im_end|>')["input_ids"]
    _, calls = asyncio.run(parser.extract_tool_calls(ids))
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("submit", {"answer": "3"})]
