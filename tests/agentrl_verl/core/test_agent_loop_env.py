"""The ``agentrl_agent`` loop against the real environment stack (controller + OS and DB worker processes) with a
scripted policy behind a server-client stand-in: known episodes give exactly the expected tokens, masks,
log-probs, rewards and statuses (a solved DB item, a malformed call, an OS turn-limit ending, an unreachable
controller)."""

from __future__ import annotations

import importlib.util
import json
import socket
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from agentrl_verl.core import agent_loop
from agentrl_verl.core.episode import EpisodeRecord
from agentrl_verl.models.tiny import build_tiny_model
from env_adapters.client import EnvClient
from env_adapters.launcher import EnvStack

pytestmark = [pytest.mark.slow, pytest.mark.docker]


def _load_unit_test():
    # One definition of the scripted policy, the loop builder and the token checks: the unit test's.
    spec = importlib.util.spec_from_file_location("agent_loop_unit", Path(__file__).with_name("test_agent_loop.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


unit = _load_unit_test()
DB_QUESTION_SQL = ('SELECT "Presentation of Credentials" FROM "US Ambassadors and Envoy Extraordinary to Colombia" '
                   "WHERE \"Termination of Mission\" = 'August 15, 2000'")


class RecordingClient(EnvClient):
    """The real client, keeping what the environment said so the test can render the conversation."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.opening, self.tools, self.replies = [], [], []

    async def start_sample(self, name, index=-1, custom_task=None):
        started = await super().start_sample(name, index, custom_task)
        self.opening, self.tools = list(started.messages), list(started.tools)
        return started

    async def interact(self, session_id, message):
        reply = await super().interact(session_id, message)
        self.replies.append(reply)
        return reply


@pytest.fixture(scope="module")
def stack():
    workers = [{"task": "os", "options": {"split": "dev", "pool_size": 1}, "concurrency": 2},
               {"task": "db", "options": {"backend": "sqlite"}, "concurrency": 2}]
    with EnvStack({"controller": {"port": 0}, "workers": workers}) as env:
        yield env


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(build_tiny_model())


def _call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call><|im_end|>"


def _sent(turn: int, name: str, **arguments) -> dict:
    """The assistant message the loop sends for a parsed call on ``turn`` (1-based)."""
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {"role": "assistant", "content": "", "tool_calls": [{"id": f"call_{turn}_0", "type": "function",
                                                                 "function": function}]}


def _env_loop(tokenizer, server, env, **agent):
    # The real tasks' prompts (system prompt + tool list) are longer than the unit test's.
    return unit._loop(tokenizer, server, env, max_total_tokens=4096, prompt_length=1024, response_length=1024,
                      **agent)


def _row(task: str, index: int) -> dict:
    return {**unit._row(index), "data_source": task, "raw_prompt": [{"role": "user", "content": f"{task} #{index}"}]}


async def test_db_item_solved_exact_tokens(stack, tokenizer):
    server = unit.ScriptedServer(tokenizer, [_call("execute_sql", query=DB_QUESTION_SQL),
                                             _call("commit_final_answer", answers=["March 19, 1998"])])
    async with RecordingClient(stack.url) as env:
        out = await _env_loop(tokenizer, server, env).run({}, **_row("db", 0))
        assert EpisodeRecord.of(out).status == "completed" and out.reward_score == 1.0
        assert EpisodeRecord.of(out).turns == 2 and EpisodeRecord.of(out).env_latency_s > 0
        # The SQL really ran (this AgentBench item's table lacks the labelled row, so the result is empty).
        assert [m["role"] for m in env.replies[0].messages] == ["tool"] and env.replies[0].status.value == "running"
        sent = [_sent(1, "execute_sql", query=DB_QUESTION_SQL),
                _sent(2, "commit_final_answer", answers=["March 19, 1998"])]
        conversation = [*env.opening, sent[0], *env.replies[0].messages, sent[1]]
        assert out.prompt_ids == tokenizer.apply_chat_template(env.opening, tools=env.tools,
                                                               add_generation_prompt=True, tokenize=True,
                                                               return_dict=False)[-len(out.prompt_ids):]
        unit._check_tokens(tokenizer, server, out, conversation, tools=env.tools)


async def test_db_malformed_call_is_answered_by_env(stack, tokenizer):
    bad = '<tool_call>\n{"name": "execute_sql", "arguments": {"query": "SELECT 1"\n</tool_call><|im_end|>'
    server = unit.ScriptedServer(tokenizer, [bad, _call("commit_final_answer", answers=["nope"])])
    async with RecordingClient(stack.url) as env:
        out = await _env_loop(tokenizer, server, env).run({}, **_row("db", 0))
    # The env saw the text as written and ended or answered it; either way the episode is not a success.
    assert env.replies[0].status.value in {"agent invalid action", "agent validation failed", "running"}
    assert EpisodeRecord.of(out).status != "completed" or out.reward_score == 0.0
    assert out.response_ids[: len(server.outputs[0])] == server.outputs[0]
    assert out.response_mask[: len(server.outputs[0])] == [1] * len(server.outputs[0])


async def test_os_turn_limit_cancels_session(stack, tokenizer):
    server = unit.ScriptedServer(tokenizer, [_call("bash_action", script="cat /root/log"),
                                             _call("bash_action", script="sleep 1; cat /root/log")])
    async with RecordingClient(stack.url) as env:
        out = await _env_loop(tokenizer, server, env, max_turns=2).run({}, **_row("os", 0))
        assert EpisodeRecord.of(out).status == "task limit reached" and out.reward_score == pytest.approx(-0.2)
        conversation = [*env.opening, _sent(1, "bash_action", script="cat /root/log"), *env.replies[0].messages,
                        _sent(2, "bash_action", script="sleep 1; cat /root/log")]
        unit._check_tokens(tokenizer, server, out, conversation, tools=env.tools)
        sessions = await env.list_sessions()
    assert all(s["status"] != "running" for s in sessions.values()), sessions


async def test_unreachable_controller_stops_the_run_after_the_outage_timeout(tokenizer, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    server = unit.ScriptedServer(tokenizer, [])
    monkeypatch.setattr(agent_loop, "RETRY_BACKOFF_S", (0.01, 0.01))
    async with EnvClient(f"http://127.0.0.1:{port}", max_retries=1, backoff=0.01) as env:
        loop = unit._loop(tokenizer, server, env, env_options={"outage_timeout_s": 0.2})
        with pytest.raises(agent_loop.EnvironmentOutage, match="db/0"):
            await loop.run({}, **_row("db", 0))
