"""The ``agentrl_agent`` loop with verl's real classes, a scripted policy behind a server-client stand-in and
a scripted environment client: exact token ids, masks, log-probs, rewards and statuses."""

from __future__ import annotations

import json
import logging

import pytest
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl.experimental.agent_loop import tool_parser
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, _agent_loop_registry
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.workers.rollout.replica import TokenOutput

from agentrl_verl.core import agent_loop
from agentrl_verl.core.agent_loop import AGENT_NAME, AgentRLAgentLoop, EnvironmentOutage
from agentrl_verl.core.episode import EpisodeRecord
from agentrl_verl.models.tiny import build_tiny_model
from env_adapters.client import EnvRequestError, EnvUnavailable, StartedSession
from env_adapters.protocol import InteractResponse, SampleStatus
from env_adapters.task import function_tool

TOOLS = [function_tool("bash_action", "run a script", {"script": {"type": "string"}})]
OPENING = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Count the files."}]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(build_tiny_model())


class ScriptedServer:
    """Stands in for verl's LLMServerClient: returns scripted texts as tokens with known log-probs."""

    def __init__(self, tokenizer, texts: list[str], global_steps: int = 3):
        self.tokenizer, self.texts, self.global_steps = tokenizer, list(texts), global_steps
        self.prompts: list[list[int]] = []
        self.outputs: list[list[int]] = []
        self.sampling_params: list[dict] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        self.prompts.append(list(prompt_ids))
        self.sampling_params.append(dict(sampling_params))
        ids = self.tokenizer.encode(self.texts.pop(0), add_special_tokens=False)
        ids = ids[: sampling_params["max_tokens"]]
        self.outputs.append(ids)
        return TokenOutput(token_ids=ids, log_probs=[-0.01 * (len(self.outputs) * 100 + i) for i in range(len(ids))],
                           stop_reason="completed", extra_fields={"global_steps": self.global_steps})


class ScriptedEnv:
    """Stands in for EnvClient: scripted replies; records what the agent sent and what it cancelled."""

    def __init__(self, replies: list, fail_start: bool = False):
        self.replies, self.fail_start = list(replies), fail_start
        self.sent: list[dict] = []
        self.cancelled: list[int] = []
        self.started: list[tuple] = []

    async def start_sample(self, name, index=-1, custom_task=None):
        self.started.append((name, index))
        if self.fail_start:
            raise EnvUnavailable("start_sample failed after 6 attempts: connection refused")
        return StartedSession(session_id=7, messages=[dict(m) for m in OPENING], tools=TOOLS)

    async def interact(self, session_id, message):
        assert session_id == 7
        self.sent.append(message)
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def cancel(self, session_id):
        self.cancelled.append(session_id)


def _config(response_length=512, prompt_length=256, env_options=None, **agent):
    return OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"prompt_length": prompt_length, "response_length": response_length,
                                          "multi_turn": {"format": "hermes"}}},
        "data": {"apply_chat_template_kwargs": {}},
        "agentrl": {"env": {"url": "http://unused", **(env_options or {})}, "agent": agent},
    })


def _loop(tokenizer, server, env, env_options=None, **agent) -> AgentRLAgentLoop:
    config = _config(env_options=env_options, **agent)
    return AgentRLAgentLoop(
        trainer_config=DictConfigWrap(config), server_manager=server, tokenizer=tokenizer, processor=None,
        dataset_cls=RLHFDataset, data_config=DictConfigWrap(config.data), hf_model_type="qwen2", env_client=env)


def _row(index=3):
    return {"data_source": "os-std", "extra_info": {"index": index}, "index": index, "global_steps": 4,
            "raw_prompt": [{"role": "user", "content": "os-std #3"}], "agent_name": AGENT_NAME}


def _call(script: str) -> str:
    call = json.dumps({"name": "bash_action", "arguments": {"script": script}})
    return f"<tool_call>\n{call}\n</tool_call><|im_end|>"


def _tool(content: str, call_id: str = "call_1_0"):
    return {"role": "tool", "tool_call_id": call_id, "name": "bash_action", "content": content}


def _check_tokens(tokenizer, server, out, conversation, tools=TOOLS):
    """Token-in/token-out: the engine saw exactly its own earlier tokens, and the sequence is the template of
    ``conversation`` (which ends with the last assistant message)."""
    full = out.prompt_ids + out.response_ids
    # Each turn's prompt extends the previous one by exactly the tokens generated (plus env tokens).
    for prev_prompt, prev_out, prompt in zip(server.prompts, server.outputs, server.prompts[1:], strict=False):
        assert prompt[: len(prev_prompt) + len(prev_out)] == prev_prompt + prev_out
    # Generated spans carry mask 1 and their exact log-probs; everything else mask 0, log-prob 0.
    expected_mask, expected_lp = [], []
    response = out.response_ids
    pos = 0
    for k, (prompt, gen) in enumerate(zip(server.prompts, server.outputs, strict=True)):
        start = len(prompt) - len(out.prompt_ids)
        expected_mask += [0] * (start - pos) + [1] * len(gen)
        expected_lp += [0.0] * (start - pos) + [-0.01 * ((k + 1) * 100 + i) for i in range(len(gen))]
        assert response[start: start + len(gen)] == gen
        pos = start + len(gen)
    expected_mask += [0] * (len(response) - pos)
    expected_lp += [0.0] * (len(response) - pos)
    assert out.response_mask == expected_mask
    assert out.response_logprobs == pytest.approx(expected_lp)
    # And the whole sequence is what the chat template renders (generation stops at <|im_end|>, before "\n").
    rendered = tokenizer.apply_chat_template(conversation, tools=tools, tokenize=False)
    assert tokenizer.decode(full) == rendered.removesuffix("\n")
    return full


async def test_completed_episode_exact_tokens(tokenizer):
    server = ScriptedServer(tokenizer, [_call("ls | wc -l"), _call("echo done")])
    env = ScriptedEnv([
        InteractResponse(finish=False, status=SampleStatus.RUNNING, messages=[_tool("12")]),
        InteractResponse(finish=True, status=SampleStatus.COMPLETED, reward=1.0),
    ])
    out = await _loop(tokenizer, server, env).run({"temperature": 1.0}, **_row())

    assert env.started == [("os-std", 3)] and env.cancelled == []
    assert out.prompt_ids == tokenizer.apply_chat_template(OPENING, tools=TOOLS, add_generation_prompt=True,
                                                           tokenize=True, return_dict=False)
    assert env.sent[0] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1_0", "type": "function",
         "function": {"name": "bash_action", "arguments": json.dumps({"script": "ls | wc -l"})}}]}
    conversation = [*OPENING, env.sent[0], _tool("12"), env.sent[1]]
    full = _check_tokens(tokenizer, server, out, conversation)
    # The env tokens between the turns are the template difference: "\n" + the tool turn + generation prompt.
    env_text = "\n<|im_start|>user\n<tool_response>\n12\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    first_gen_end = len(server.prompts[0]) + len(server.outputs[0])
    assert full[first_gen_end: len(server.prompts[1])] == tokenizer.encode(env_text, add_special_tokens=False)
    assert out.reward_score == 1.0
    assert EpisodeRecord.of(out).status == "completed" and EpisodeRecord.of(out).turns == 2
    assert EpisodeRecord.of(out).task == "os-std"
    assert EpisodeRecord.of(out).generated_tokens == sum(map(len, server.outputs))
    assert EpisodeRecord.of(out).oldest_version == EpisodeRecord.of(out).newest_version == 3
    assert EpisodeRecord.of(out).turn_log.versions == [3, 3]
    assert all(p["logprobs"] is True and p["temperature"] == 1.0 for p in server.sampling_params)


async def test_malformed_call_goes_to_env_verbatim(tokenizer):
    bad = '<tool_call>\n{"name": "bash_action", "arguments": {"script": "ls"}\n</tool_call><|im_end|>'
    server = ScriptedServer(tokenizer, [bad])
    env = ScriptedEnv([InteractResponse(finish=True, status=SampleStatus.AGENT_INVALID_ACTION, reward=0.0)])
    out = await _loop(tokenizer, server, env).run({}, **_row())
    assert env.sent == [{"role": "assistant", "content": bad.removesuffix("<|im_end|>").strip()}]
    assert EpisodeRecord.of(out).status == "agent invalid action"
    assert out.reward_score == pytest.approx(-0.2)
    assert out.response_ids == server.outputs[0] and out.response_mask == [1] * len(server.outputs[0])
    assert env.cancelled == []


@pytest.mark.parametrize("level", ["WARN", "DEBUG"])
async def test_malformed_calls_are_logged_only_at_debug(tokenizer, level):
    # verl's parser logs a call it cannot decode as an error; the environment answers such a call like any invalid
    # action, so it is the model's mistake and shows only when the user asks verl for DEBUG.
    parser_logger = tool_parser.logger
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    old_level = parser_logger.level
    parser_logger.addHandler(handler)
    parser_logger.setLevel(level)
    try:
        bad = '<tool_call>\n{"name": "bash_action", "arguments": {"script": "ls"}\n</tool_call><|im_end|>'
        env = ScriptedEnv([InteractResponse(finish=True, status=SampleStatus.AGENT_INVALID_ACTION, reward=0.0)])
        await _loop(tokenizer, ScriptedServer(tokenizer, [bad]), env).run({}, **_row())
        parser_logger.warning("Tool 'x' is not defined in the tools list.")
    finally:
        parser_logger.removeHandler(handler)
        parser_logger.setLevel(old_level)
    shown = [(r.levelname, r.getMessage().split(":")[0]) for r in records]
    malformed = [("DEBUG", "Failed to decode tool call")] if level == "DEBUG" else []
    assert shown == [*malformed, ("WARNING", "Tool 'x' is not defined in the tools list.")]


async def test_turn_limit_cancels_session(tokenizer):
    server = ScriptedServer(tokenizer, [_call("ls"), _call("pwd")])
    env = ScriptedEnv([InteractResponse(finish=False, status=SampleStatus.RUNNING, messages=[_tool("a")]),
                       InteractResponse(finish=False, status=SampleStatus.RUNNING,
                                        messages=[_tool("b", "call_2_0")])])
    out = await _loop(tokenizer, server, env, max_turns=2, penalty=-0.5).run({}, **_row())
    assert EpisodeRecord.of(out).status == "task limit reached" and EpisodeRecord.of(out).turns == 2
    assert out.reward_score == -0.5
    assert env.cancelled == [7]
    # The trajectory ends with the last generated tokens (the unused env reply is not appended).
    assert out.response_ids[-len(server.outputs[1]):] == server.outputs[1]
    _check_tokens(tokenizer, server, out, [*OPENING, env.sent[0], _tool("a"), env.sent[1]])


async def test_total_length_limit(tokenizer):
    server = ScriptedServer(tokenizer, [_call("ls"), _call("x" * 400)])
    env = ScriptedEnv([InteractResponse(finish=False, status=SampleStatus.RUNNING, messages=[_tool("1")])])
    loop = _loop(tokenizer, server, env, max_total_tokens=120)
    out = await loop.run({}, **_row())
    assert EpisodeRecord.of(out).status == "agent context limit"
    assert len(out.prompt_ids) + len(out.response_ids) <= 120
    assert server.sampling_params[1]["max_tokens"] == 120 - len(server.prompts[1])
    assert env.cancelled == [7] and out.reward_score == pytest.approx(-0.2)


@pytest.fixture
def fast_retries(monkeypatch):
    monkeypatch.setattr(agent_loop, "RETRY_BACKOFF_S", (0.01, 0.01))


@pytest.mark.parametrize("loss", [
    EnvUnavailable("interact: ServerDisconnectedError"),
    EnvRequestError(404, "no session 7", "interact"),  # a restarted controller
    InteractResponse(finish=True, status=SampleStatus.TASK_ERROR, metrics={"env_lost": "worker 1 down"}),
])
async def test_an_episode_the_environment_lost_is_played_again_on_the_same_prompt(tokenizer, fast_retries, loss):
    server = ScriptedServer(tokenizer, [_call("ls"), _call("pwd"), _call("ls")])
    done = InteractResponse(finish=True, status=SampleStatus.COMPLETED, reward=1.0, messages=[])
    env = ScriptedEnv([InteractResponse(finish=False, status=SampleStatus.RUNNING, messages=[_tool("1")]), loss,
                       done])
    out = await _loop(tokenizer, server, env).run({}, **_row())
    # The lost attempt (two turns) is dropped: the output is the second attempt's one completed turn.
    assert env.started == [("os-std", 3), ("os-std", 3)]
    assert env.cancelled == ([] if isinstance(loss, InteractResponse) else [7])  # a session the env ended is not
    assert EpisodeRecord.of(out).status == "completed" and EpisodeRecord.of(out).turns == 1
    assert EpisodeRecord.of(out).env_retries == 1 and EpisodeRecord.of(out).env_unavailable_s > 0
    assert sum(out.response_mask) == len(server.outputs[-1])


async def test_a_request_the_environment_refused_is_a_masked_task_error(tokenizer, fast_retries):
    server = ScriptedServer(tokenizer, [_call("ls"), _call("pwd")])
    env = ScriptedEnv([InteractResponse(finish=False, status=SampleStatus.RUNNING, messages=[_tool("1")]),
                       EnvRequestError(400, "malformed", "interact")])
    out = await _loop(tokenizer, server, env).run({}, **_row())
    assert EpisodeRecord.of(out).status == "task error" and EpisodeRecord.of(out).env_retries == 0
    assert out.response_mask == [0] * len(out.response_ids) and len(out.response_ids) > 0
    assert env.started == [("os-std", 3)] and env.cancelled == [7]


async def test_an_environment_unreachable_beyond_the_timeout_stops_the_run(tokenizer, fast_retries):
    server = ScriptedServer(tokenizer, [])
    env = ScriptedEnv([], fail_start=True)
    with pytest.raises(EnvironmentOutage, match=r"os-std/3 .*agentrl.env.outage_timeout_s=0.05.*connection refused"):
        await _loop(tokenizer, server, env, env_options={"outage_timeout_s": 0.05}).run({}, **_row())
    assert len(env.started) > 1 and server.prompts == [] and env.cancelled == []


def test_registered():
    assert _agent_loop_registry[AGENT_NAME]["_target_"] == "agentrl_verl.core.agent_loop.AgentRLAgentLoop"


class PoolServer(ScriptedServer):
    """A scripted server behind a cross-policy pool: each turn tagged with the member and its weight version."""

    def __init__(self, tokenizer, texts, members: list[tuple[str, int]]):
        super().__init__(tokenizer, texts)
        self.members = list(members)

    async def generate(self, request_id, **kwargs) -> TokenOutput:
        output = await super().generate(request_id, **kwargs)
        policy, version = self.members.pop(0)
        output.extra_fields.update({"global_steps": version, "policy": policy, "policy_version": version})
        return output


async def test_version_range_counts_only_the_trained_policys_turns(tokenizer):
    # A stale pool member's turn (version 0) is off-policy by design: it must not look like pipeline lag.
    server = PoolServer(tokenizer, [_call("ls"), _call("pwd"), _call("echo")],
                        [("current", 5), ("stale", 0), ("current", 6)])
    env = ScriptedEnv([InteractResponse(finish=False, status=SampleStatus.RUNNING, messages=[_tool("1")]),
                       InteractResponse(finish=False, status=SampleStatus.RUNNING, messages=[_tool("2")]),
                       InteractResponse(finish=True, status=SampleStatus.COMPLETED, reward=1.0)])
    out = await _loop(tokenizer, server, env).run({}, **_row())
    assert EpisodeRecord.of(out).turn_log.versions == [5, 0, 6]
    assert EpisodeRecord.of(out).turn_log.policies == ["current", "stale", "current"]
    assert (EpisodeRecord.of(out).oldest_version, EpisodeRecord.of(out).newest_version) == (5, 6)


class ResumingServer(ScriptedServer):
    """verl's FullyAsyncLLMServerClient view: the second turn was aborted at a weight update and resumed."""

    async def generate(self, request_id, **kwargs) -> TokenOutput:
        output = await super().generate(request_id, **kwargs)
        first, last = (3, 3) if len(self.outputs) == 1 else (3, 4)
        output.extra_fields.update({"global_steps": last, "min_global_steps": first, "max_global_steps": last})
        return output


async def test_a_resumed_turn_takes_its_oldest_version_and_is_counted(tokenizer):
    server = ResumingServer(tokenizer, [_call("ls"), _call("pwd")])
    env = ScriptedEnv([InteractResponse(finish=False, status=SampleStatus.RUNNING, messages=[_tool("1")]),
                       InteractResponse(finish=True, status=SampleStatus.COMPLETED, reward=1.0)])
    out = await _loop(tokenizer, server, env).run({}, **_row())
    # Its first tokens came from version 3: the staleness bound must see 3, not the version that finished it.
    assert EpisodeRecord.of(out).turn_log.versions == [3, 3]
    assert EpisodeRecord.of(out).resumed_turns == 1
