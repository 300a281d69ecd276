"""Token fidelity with a real tokenizer: SmolLM2-135M-Instruct's (49k-token BPE, the project's ChatML tool template),
one episode of every family through the agent loop's own token building.

Each episode is a scripted one: the family's expert messages played against its real task in-process (``os``: its
real opening and tools, a scripted shell reply, as no container runs here), replayed through ``agentrl_agent`` with
the expert's messages written as the model would write them (their rendering after the generation prompt, up to the
turn's ``<|im_end|>``), no generation. The trained sequence must keep every generated id as generated, the loss mask
must cover exactly those ids, the environment's tokens must be the template's rendering of its messages in context,
and the messages the loop parses from the tokens must be the expert's.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl.experimental.agent_loop.agent_loop import DictConfigWrap
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.utils.tokenizer.continuous_token import QwenContinuousTokenBuilder
from verl.workers.rollout.replica import TokenOutput

from agentrl_verl.core.agent_loop import AGENT_NAME, AgentRLAgentLoop
from agentrl_verl.core.chat_template import render
from agentrl_verl.core.episode import EpisodeRecord
from env_adapters.client import StartedSession
from env_adapters.demonstrations import generate_demonstrations
from env_adapters.protocol import InteractResponse, SampleStatus
from env_adapters.task import assistant_tool_call
from env_adapters.tasks.os_interaction.items import load_split
from env_adapters.tasks.os_interaction.task import SYSTEM_PROMPT, TOOLS

FAMILIES: dict[str, dict[str, Any]] = {
    "calc": {"size": 50},
    "db": {},
    "kg": {"preset": "easy", "prompt": "short", "size": 40},
    "webshop": {"preset": "easy"},
    "alfworld": {"task_types": ["pick_and_place_simple"], "max_receptacles": 3, "distractors": 0, "size": 20},
}
"""Families with a scripted expert, and their options (small sizes)."""


@pytest.fixture(scope="module")
def tokenizer():
    from agentrl_verl.models.smollm2 import build_smollm2

    return AutoTokenizer.from_pretrained(build_smollm2())


def os_episode() -> tuple[list[dict], list[dict], list[dict], float]:
    """The os family's real opening and tools with a scripted shell turn and answer (no container)."""
    item = load_split("dev")[0]
    opening = [{"role": "system", "content": SYSTEM_PROMPT.format(max_rounds=8)},
               {"role": "user", "content": item.description}]
    call = assistant_tool_call("bash_action", {"script": "ls /etc | wc -l"}, call_id="call_0")
    reply = {"role": "tool", "tool_call_id": "call_0", "name": "bash_action", "content": "12\n"}
    answer = assistant_tool_call("answer_action", {"answer": "12"}, call_id="call_1")
    return opening, list(TOOLS), [call, reply, answer], 0.0


def family_episode(family: str) -> tuple[list[dict], list[dict], list[dict], float]:
    """(opening messages, tools, the turns after the opening, reward) of one expert episode of ``family``."""
    if family == "os":
        return os_episode()
    episode = generate_demonstrations(family, [12] if family != "db" else [3], FAMILIES[family])[0]
    first = next(i for i, m in enumerate(episode.messages) if m["role"] == "assistant")
    return episode.messages[:first], episode.tools, episode.messages[first:], episode.reward


class ReplayServer:
    """The policy: each turn, the expert's next assistant message as the model would write it."""

    def __init__(self, tokenizer, texts: list[str]):
        self.tokenizer, self.texts = tokenizer, list(texts)
        self.outputs: list[list[int]] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        ids = self.tokenizer.encode(self.texts.pop(0), add_special_tokens=False)
        self.outputs.append(ids)
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed",
                           extra_fields={"global_steps": 1})


class ReplayEnv:
    """The environment: the episode's opening, then after each assistant message the messages that followed it."""

    def __init__(self, opening, tools, replies: list[list[dict]], reward: float):
        self.opening, self.tools, self.replies, self.reward = opening, tools, list(replies), reward
        self.sent: list[dict] = []

    async def start_sample(self, name, index=-1, custom_task=None):
        return StartedSession(session_id=1, messages=[dict(m) for m in self.opening], tools=self.tools)

    async def interact(self, session_id, message):
        self.sent.append(message)
        messages = self.replies.pop(0)
        if not self.replies:
            return InteractResponse(finish=True, status=SampleStatus.COMPLETED, reward=self.reward, messages=messages)
        return InteractResponse(finish=False, status=SampleStatus.RUNNING, messages=messages)

    async def cancel(self, session_id):
        raise AssertionError("a completed episode is not cancelled")


def emitted(tokenizer, before: list[dict], message: dict, tools: list[dict]) -> str:
    """``message`` as the model writes it after ``before``: its rendering after the generation prompt, up to and
    including the turn's end token (generation stops there; the template's newline after it is not generated)."""
    prompt = render(tokenizer, before, tools, add_generation_prompt=True)
    full = render(tokenizer, [*before, message], tools)
    assert full.startswith(prompt)
    return full[len(prompt):].removesuffix("\n")


def split_turns(turns: list[dict]) -> tuple[list[dict], list[list[dict]]]:
    """The assistant messages, and the environment messages after each of them."""
    assistant, replies = [], []
    for message in turns:
        if message["role"] == "assistant":
            assistant.append(message)
            replies.append([])
        else:
            replies[-1].append(message)
    return assistant, replies


def calls(message: dict) -> tuple[str, list[tuple[str, Any]]]:
    """What an assistant message says: its content and each call's name and decoded arguments."""
    return (message.get("content") or "", [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                                           for c in message.get("tool_calls") or []])


def agent_loop(tokenizer, server, env) -> AgentRLAgentLoop:
    config = OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"prompt_length": 8192, "response_length": 8192,
                                          "multi_turn": {"format": "hermes"}}},
        "data": {"apply_chat_template_kwargs": {}},
        "agentrl": {"env": {"url": "http://unused"}, "agent": {"max_turns": 16, "max_new_tokens": 1024,
                                                                "max_total_tokens": 16384}},
    })
    return AgentRLAgentLoop(trainer_config=DictConfigWrap(config), server_manager=server, tokenizer=tokenizer,
                            processor=None, dataset_cls=RLHFDataset, data_config=DictConfigWrap(config.data),
                            hf_model_type="llama", env_client=env)


@pytest.fixture(scope="module")
def episodes() -> dict[str, tuple[list[dict], list[dict], list[dict], float]]:
    return {family: family_episode(family) for family in ("os", *FAMILIES)}


@pytest.mark.parametrize("family", ["calc", "db", "os", "kg", "webshop", "alfworld"])
async def test_generated_tokens_are_trained_as_generated_and_env_tokens_are_the_template(tokenizer, episodes, family):
    opening, tools, turns, reward = episodes[family]
    assistant, replies = split_turns(turns)
    conversation, texts = list(opening), []
    for message, reply in zip(assistant, replies, strict=True):
        texts.append(emitted(tokenizer, conversation, message, tools))
        conversation += [message, *reply]
    server, env = ReplayServer(tokenizer, texts), ReplayEnv(opening, tools, replies, reward)
    loop = agent_loop(tokenizer, server, env)
    assert isinstance(loop.continuous_token_builder, QwenContinuousTokenBuilder)  # ChatML boundaries on `llama`
    out = await loop.run({"temperature": 1.0}, data_source=family, extra_info={"index": 0}, global_steps=1,
                         raw_prompt=[], agent_name=AGENT_NAME)

    assert EpisodeRecord.of(out).status == "completed" and EpisodeRecord.of(out).turns == len(assistant)
    # The loop parsed from the tokens what the expert said.
    assert [calls(m) for m in env.sent] == [calls(m) for m in assistant]
    # Token in, token out: the trained ids at mask 1 are exactly the generated ids, in order, and nothing else.
    trained = [i for i, m in zip(out.response_ids, out.response_mask, strict=True) if m == 1]
    assert trained == [i for ids in server.outputs for i in ids]
    assert out.prompt_ids == tokenizer.encode(render(tokenizer, opening, tools, add_generation_prompt=True),
                                              add_special_tokens=False)
    # Each environment segment is the template's rendering of its messages in context: the newline after the
    # turn's <|im_end|>, the tool turn with its <tool_response> blocks, and the next generation prompt.
    segments, current = [], []
    for token, mask in zip(out.response_ids, out.response_mask, strict=True):
        if mask == 0:
            current.append(token)
        elif current:
            segments.append(current)
            current = []
    history = list(opening)
    for k, (message, reply) in enumerate(zip(assistant[:-1], replies[:-1], strict=True)):
        before = render(tokenizer, [*history, message], tools)
        history += [message, *reply]
        expected = render(tokenizer, history, tools, add_generation_prompt=True)[len(before) - 1:]
        assert tokenizer.decode(segments[k]) == expected, (family, k)
        assert expected.startswith("\n<|im_start|>") and expected.endswith("<|im_start|>assistant\n")
    assert len(segments) == len(assistant) - 1
    # And the whole sequence reads as the template renders the conversation the loop sent (the last reply ends the
    # episode: it is never appended).
    sent_conversation = list(opening)
    for message, reply in zip(env.sent[:-1], replies[:-1], strict=True):
        sent_conversation += [message, *reply]
    rendered = render(tokenizer, [*sent_conversation, env.sent[-1]], tools)
    assert tokenizer.decode(out.prompt_ids + out.response_ids) == rendered.removesuffix("\n")
