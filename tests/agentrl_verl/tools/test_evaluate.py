"""Evaluation (``agentrl_verl.tools.evaluate``): the one episode runner outside training (the ``agentrl_agent``
loop against the real environment stack, with a scripted policy and with the tiny model in process), and the
OpenAI-compatible endpoints of the cross-policy evaluation pool."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM
from verl.workers.rollout.replica import TokenOutput

from agentrl_verl.core.config import Endpoint
from agentrl_verl.core.episode import EpisodeRecord
from agentrl_verl.pipeline.cold_start import tokenize_episode
from agentrl_verl.tools.evaluate import (
    EvalResult,
    OpenAIEndpointClient,
    evaluate_model,
    evaluation_config,
    parse_endpoint,
    run_episodes,
)
from env_adapters.demonstrations import generate_demonstrations
from env_adapters.launcher import EnvStack

CALC = {"seed": 0, "size": 50}


@pytest.fixture(scope="module")
def stack():
    with EnvStack({"controller": {"port": 0},
                   "workers": [{"task": "calc", "name": "calc", "concurrency": 8, "options": CALC}]}) as env:
        yield env


class ScriptedPolicy:
    """verl's ``generate`` replaying fixed replies: ``reply(prompt text, assistant turns so far) -> text``."""

    def __init__(self, tokenizer, reply):
        self.tokenizer, self.reply, self.prompts = tokenizer, reply, []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.prompts.append(list(prompt_ids))
        text = self.tokenizer.decode(prompt_ids)
        ids = self.tokenizer.encode(self.reply(text, text.count("<|im_start|>assistant") - 1),
                                    add_special_tokens=False)
        return TokenOutput(token_ids=ids, log_probs=[0.0] * len(ids), stop_reason="completed",
                           extra_fields={"global_steps": None})


def _assistant_spans(tokenizer, messages, tools) -> list[str]:
    """A demonstration's assistant turns as a model generates them (the warm-up's trained spans, decoded)."""
    ids, mask = tokenize_episode(tokenizer, messages, tools)
    groups = itertools.groupby(zip(ids, mask, strict=True), key=lambda x: x[1])
    return [tokenizer.decode([i for i, _ in span]) for k, span in groups if k]


def _rows(indices):
    return [{"data_source": "calc", "extra_info": {"index": i}, "prompt": [{"role": "user", "content": "x"}]}
            for i in indices]


def test_the_agent_loop_plays_demonstrated_replies_to_success_and_malformed_ones_to_failure(stack, tokenizer):
    demos = generate_demonstrations("calc", range(12), CALC)
    replies = {d.messages[0]["content"]: _assistant_spans(tokenizer, d.messages, d.tools) for d in demos}

    def oracle(prompt: str, turn: int) -> str:
        return replies[next(q for q in replies if q in prompt)][turn]

    config = evaluation_config(640, 640, stack.url, {"max_turns": 4, "max_new_tokens": 48, "max_total_tokens": 640})
    policy = ScriptedPolicy(tokenizer, oracle)
    outputs = asyncio.run(run_episodes(_rows(range(12)), policy, tokenizer, config, {"temperature": 0.0},
                                       concurrency=4))
    assert [EpisodeRecord.of(o).status for o in outputs] == ["completed"] * 12
    assert [o.reward_score for o in outputs] == [1.0] * 12 and all(EpisodeRecord.of(o).turns == 2 for o in outputs)
    # Token-in/token-out across turns: the second turn's prompt extends the first turn's prompt and reply.
    assert len(policy.prompts) == 24 and all(any(p[:len(q)] == q for q in policy.prompts if len(q) < len(p))
                                             for p in policy.prompts if "<tool_response>" in tokenizer.decode(p))

    outputs = asyncio.run(run_episodes(_rows(range(3)), ScriptedPolicy(tokenizer, lambda p, t: "no idea<|im_end|>"),
                                       tokenizer, config, {"temperature": 0.0}))
    assert [EpisodeRecord.of(o).status for o in outputs] == ["agent invalid action"] * 3


def test_evaluate_model_plays_the_tiny_model_greedy_and_sampled(stack, model_dir, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    kwargs = {"max_turns": 2, "max_new_tokens": 16, "max_context": 640, "concurrency": 1}
    greedy = evaluate_model(stack.url, model, tokenizer, {"calc": [0, 1, 2]}, **kwargs)["calc"]
    assert isinstance(greedy, EvalResult) and greedy.mode == "greedy"
    assert [e["index"] for e in greedy.episodes] == [0, 1, 2] and all(e["task"] == "calc" for e in greedy.episodes)
    # A random model never calls a tool correctly: every episode fails, with the agent loop's statuses.
    assert greedy.success_rate == 0.0 and all(e["status"] != "completed" for e in greedy.episodes)
    assert all(e["text"].startswith("<|im_start|>") for e in greedy.episodes)
    again = evaluate_model(stack.url, model, tokenizer, {"calc": [0, 1, 2]}, **kwargs)["calc"]
    assert [e["text"] for e in again.episodes] == [e["text"] for e in greedy.episodes]  # greedy is deterministic
    sampled = [evaluate_model(stack.url, model, tokenizer, {"calc": [0, 1, 2]}, greedy=False, seed=seed,
                              **kwargs)["calc"] for seed in (0, 0, 1)]
    texts = [[e["text"] for e in r.episodes] for r in sampled]
    assert sampled[0].mode == "sampled" and texts[0] == texts[1] and texts[0] != texts[2]  # seeded sampling


def test_parse_endpoint():
    assert parse_endpoint("a=http://h:1/v1") == Endpoint("a", "http://h:1/v1", "a")
    assert parse_endpoint("b=http://h:2/v1,model=qwen,weight=0.5,api_key_env=KEY") == Endpoint(
        "b", "http://h:2/v1", "qwen", 0.5, "KEY"
    )
    for bad in ("nourl", "a=http://h,colour=red"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_endpoint(bad)


def _transport(seen: list, choice: dict) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((str(request.url), request.headers.get("authorization"), json.loads(request.content)))
        return httpx.Response(200, json={"choices": [choice]})

    return httpx.MockTransport(handler)


async def test_client_sends_token_ids_and_reads_token_ids_and_logprobs(monkeypatch):
    monkeypatch.setenv("EVAL_KEY", "sekrit")
    seen = []
    choice = {"text": "ab", "finish_reason": "stop",
              "logprobs": {"tokens": ["token_id:5", "token_id:9"], "token_logprobs": [-0.5, -1.25]}}
    endpoint = Endpoint("m", "http://srv/v1/", "tiny", api_key_env="EVAL_KEY")
    client = OpenAIEndpointClient(endpoint, transport=_transport(seen, choice))
    out = await client.generate("r1", prompt_ids=[1, 2, 3], sampling_params={"max_tokens": 4, "temperature": 0.7})
    await client.aclose()
    assert (out.token_ids, out.log_probs, out.stop_reason) == ([5, 9], [-0.5, -1.25], "completed")
    url, auth, body = seen[0]
    assert url == "http://srv/v1/completions" and auth == "Bearer sekrit"
    assert body["prompt"] == [1, 2, 3] and body["model"] == "tiny" and body["max_tokens"] == 4
    assert body["return_tokens_as_token_ids"] is True and body["logprobs"] == 1


async def test_client_rejects_servers_without_token_ids():
    choice = {"text": "ab", "finish_reason": "stop", "logprobs": {"tokens": ["a", "b"], "token_logprobs": [0, 0]}}
    client = OpenAIEndpointClient(Endpoint("m", "http://srv/v1", "tiny"), transport=_transport([], choice))
    with pytest.raises(RuntimeError, match="endpoint 'm' .* did not return generated token ids"):
        await client.generate("r1", prompt_ids=[1], sampling_params={})
    await client.aclose()
