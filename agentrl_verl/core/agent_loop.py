"""The AgentRL episode as a verl agent loop (``agentrl_agent``): multi-turn function calling against the
environment controller.

One instance runs one episode (verl builds a fresh instance per sample):

1. ``start_sample(task, index)`` on the controller gives the opening messages and the tool schemas; the
   chat template renders them to the prompt token ids.
2. Each turn: the policy generates from the running token ids (:meth:`AgentRLAgentLoop.generate`, the one
   place a turn's tokens come from, so a router over several policies can be slotted in); the tool
   parser (verl's registry, ``hermes`` for Qwen2.5-style models) turns the tokens into an OpenAI
   assistant message that goes to the environment as the model wrote it; the environment's new messages
   are appended as the chat-template difference between turns.
3. The episode stops when the environment finishes it, at the turn limit (status ``task limit reached``),
   or when the next turn would not fit the total-token budget or verl's response width (status
   ``agent context limit``). A session still running at the end is always cancelled.

Tokens are kept exactly as generated (never re-encoded); response mask 1 on generated tokens, 0 on
environment tokens; the behaviour log-prob of each generated token comes from the engine that produced it.
The reward is the environment's for a ``completed`` episode, else ``penalty``. An environment failure
(controller unreachable, worker error) ends the episode with status ``task error`` and an all-zero
response mask, so it is excluded from the loss and the advantage statistics but still counted in metrics.

Dataset rows (written by ``agentrl-verl make-data``): ``data_source`` is the task name the controller
knows, ``extra_info.index`` the sample index, ``agent_name`` ``agentrl_agent``; ``prompt`` is only a
placeholder (the real prompt comes from the environment).

Options are read from ``agentrl.agent`` of the validated config (:mod:`agentrl_verl.core.config`), overridden by
keyword arguments of an ``agent_loop_config_path`` entry; the controller address from ``agentrl.env.url``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput
from verl.experimental.agent_loop.agent_loop import register as register_agent_loop
from verl.experimental.agent_loop.tool_parser import FunctionCall, ToolParser
from verl.experimental.agent_loop.tool_parser import logger as tool_parser_logger
from verl.tools.schemas import OpenAIFunctionToolSchema
from verl.utils.tokenizer.continuous_token_wiring import (
    ContinuousTokenModelFamily,
    infer_continuous_token_model_family,
)
from verl.workers.rollout.replica import TokenOutput

from agentrl_verl.core.chat_template import check_chat_template, check_episode_tools, is_chatml
from agentrl_verl.core.config import AGENT_NAME, AgentConfig, EnvConfig, agentrl_config, with_overrides
from agentrl_verl.core.cross_policy import TurnLog, current_policy_versions
from agentrl_verl.core.episode import EpisodeRecord
from env_adapters.client import EnvClient, EnvRequestError, EnvUnavailable
from env_adapters.protocol import ENV_LOST, Message, SampleStatus, ToolSchema

logger = logging.getLogger(__name__)

# Errors that end an episode as ``task error`` instead of failing the training step.
ENV_ERRORS = (EnvUnavailable, EnvRequestError, asyncio.TimeoutError)
LOST_SESSION_STATUSES = (404, 409)
"""HTTP statuses of an interact whose session the environment lost (a restarted controller does not know it; a
dead worker's sessions were ended), as opposed to a request the environment refused."""
RETRY_BACKOFF_S = (1.0, 30.0)
"""First and largest wait before an episode the environment lost is played again (doubled per retry)."""


class EnvironmentOutage(RuntimeError):
    """The environment stayed unreachable for longer than ``agentrl.env.outage_timeout_s``."""


def _lost(error: BaseException, *, interact: bool) -> bool:
    """Whether ``error`` means the environment, not the request, failed (the episode is then played again)."""
    if isinstance(error, EnvRequestError):
        return interact and error.status_code in LOST_SESSION_STATUSES
    return isinstance(error, (EnvUnavailable, asyncio.TimeoutError))


class MalformedCallsAtDebug(logging.Filter):
    """Shows verl's "Failed to decode tool call" errors only at DEBUG (``VERL_LOGGING_LEVEL=DEBUG``), as DEBUG.

    A call the model wrote badly is the model's mistake, not the system's: its text goes to the environment verbatim,
    which answers it like any invalid action. Logged as errors they were most of a demo's log (115 of 179 lines).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.getMessage().startswith("Failed to decode tool call"):
            return True
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return tool_parser_logger.isEnabledFor(logging.DEBUG)


tool_parser_logger.addFilter(MalformedCallsAtDebug())


@dataclass
class Episode:
    """The running state of one episode (token streams, messages and bookkeeping)."""

    task: str
    index: int | str
    messages: list[Message] = field(default_factory=list)
    tools: list[ToolSchema] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)  # prompt + response, as fed to the engine
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] | None = field(default_factory=list)
    session_id: int | None = None
    finished: bool = False  # the environment ended the session (no cancel needed)
    status: SampleStatus = SampleStatus.RUNNING
    env_reward: float = 0.0
    turns: int = 0
    env_latency_s: float = 0.0
    generate_s: float = 0.0
    generated_tokens: int = 0
    env_tokens: int = 0
    resumed_turns: int = 0  # turns interrupted by a weight update and finished on the new weights
    # Cross-policy sampling: which pool member and weight version produced each turn (agentrl_verl.core.cross_policy).
    turn_log: TurnLog = field(default_factory=TurnLog)
    env_metrics: dict[str, Any] = field(default_factory=dict)
    lost: str | None = None  # why the environment lost this attempt (then it is played again), else None

    def end(self, status: SampleStatus) -> None:
        self.status = status


# Per tokenizer and model type, once per process (a loop is built per sample): the model type that picks the token
# builder, after the chat template was checked.
_TEMPLATES: weakref.WeakKeyDictionary[Any, dict[str | None, str | None]] = weakref.WeakKeyDictionary()
CHATML_MODEL_TYPE = "qwen2"
"""The model type whose token builder (verl's Qwen one) handles ChatML's turn boundary."""


def _token_model_type(tokenizer: Any, hf_model_type: str | None) -> str | None:
    """:func:`~agentrl_verl.core.chat_template.check_chat_template` (raising for a template that cannot train an
    agent), then the model type verl picks the continuous-token builder by: ``hf_model_type``, except for a ChatML
    template on an architecture verl maps to no builder (SmolLM2 is ``llama``). There the turn ends at <|im_end|>,
    where generation stops, and the template's newline after it must be the environment's first token, as verl's
    Qwen builder inserts it: the default builder would drop it."""
    known = _TEMPLATES.setdefault(tokenizer, {})
    if hf_model_type not in known:
        check_chat_template(tokenizer)
        chatml_unmapped = is_chatml(tokenizer) and infer_continuous_token_model_family(
            hf_model_type=hf_model_type) is ContinuousTokenModelFamily.DEFAULT
        if chatml_unmapped:
            logger.info("ChatML chat template on model type %r: verl's Qwen token builder handles its turn "
                        "boundaries", hf_model_type)
        known[hf_model_type] = CHATML_MODEL_TYPE if chatml_unmapped else hf_model_type
    return known[hf_model_type]


# One controller client per agent-loop worker process and event loop (verl builds a loop per sample).
_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, EnvClient]] = weakref.WeakKeyDictionary()


def shared_env_client(url: str, env: EnvConfig) -> EnvClient:
    """The process-wide :class:`EnvClient` for ``url`` on the running event loop, with ``env``'s token (read once,
    when the client is made: a token file is not read again for every episode)."""
    per_loop = _CLIENTS.setdefault(asyncio.get_running_loop(), {})
    if url not in per_loop:
        per_loop[url] = EnvClient(url, token=env.resolved_token())
    return per_loop[url]


@register_agent_loop(AGENT_NAME)
class AgentRLAgentLoop(AgentLoopBase):
    """Multi-turn function-calling episode against an AgentBench-FC controller (see the module docstring).

    Args:
        env_client: A client object to use instead of the shared :class:`EnvClient` (tests, custom routing).
        env_url: Controller address; default ``agentrl.env.url``.
        **options: :class:`~agentrl_verl.core.config.AgentConfig` fields, overriding ``agentrl.agent``.
    """

    def __init__(
        self,
        trainer_config: Any,
        server_manager: Any,
        tokenizer: Any,
        processor: Any,
        dataset_cls: Any,
        data_config: Any,
        hf_model_type: str | None = None,
        tools: Any = None,  # verl's own tool list: unused, the tools come from the environment
        env_client: Any = None,
        env_url: str | None = None,
        **options: Any,
    ) -> None:
        super().__init__(trainer_config, server_manager, tokenizer, processor, dataset_cls, data_config,
                         hf_model_type=_token_model_type(tokenizer, hf_model_type))
        agentrl = agentrl_config(self.config)
        self.options: AgentConfig = with_overrides(agentrl.agent, options, "agentrl.agent")
        self.env_url = env_url or agentrl.env.url
        self.env_config = agentrl.env
        if env_client is None and not self.env_url:
            raise ValueError("agentrl_agent needs the controller address: set +agentrl.env.url=http://HOST:PORT")
        self._env_client = env_client
        fmt = self.options.tool_format or self.rollout_config.multi_turn.format
        self.tool_parser = ToolParser.get_tool_parser(fmt, self.tokenizer)
        self.prompt_length = self.rollout_config.prompt_length
        self.response_length = self.rollout_config.response_length
        self.eos_token_id = self.tokenizer.eos_token_id

    @property
    def env(self):
        return self._env_client if self._env_client is not None else shared_env_client(self.env_url, self.env_config)

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any]) -> TokenOutput:
        """One turn's tokens from the policy (which member of the cross-policy pool serves it is the pool's choice:
        :mod:`agentrl_verl.core.policy_pool`)."""
        return await self.server_manager.generate(request_id=request_id, prompt_ids=prompt_ids,
                                                  sampling_params=sampling_params)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        task, index = str(kwargs["data_source"]), _sample_index(kwargs)
        lost_since, retries = None, 0
        while True:
            episode = Episode(task=task, index=index)
            try:
                await self._start(episode)
                if episode.status is SampleStatus.RUNNING:
                    await self._play(episode, sampling_params)
            finally:
                await self._cancel_if_running(episode)
            if episode.lost is None:
                break
            # Not the policy's doing: the same prompt is played again once the environment answers, so that its
            # group is trained whole. What the lost attempt generated is dropped.
            now = time.monotonic()
            lost_since = now if lost_since is None else lost_since
            timeout = self.env_config.outage_timeout_s
            if now - lost_since > timeout:
                raise EnvironmentOutage(
                    f"the environment at {self.env_url} lost episode {task}/{index} again and again for "
                    f"{now - lost_since:.0f} s (agentrl.env.outage_timeout_s={timeout:g}), last: {episode.lost}; "
                    "check the controller and its workers (list_workers), or raise the timeout")
            retries += 1
            wait = min(RETRY_BACKOFF_S[0] * 2 ** (retries - 1), RETRY_BACKOFF_S[1])
            logger.warning("environment lost episode %s/%s (%s); playing it again in %.0f s (retry %d)", task, index,
                           episode.lost, wait, retries)
            await asyncio.sleep(wait)
        unavailable_s = 0.0 if lost_since is None else time.monotonic() - lost_since
        return await self._output(episode, kwargs, env_retries=retries, env_unavailable_s=unavailable_s)

    # ---- episode steps -----------------------------------------------------------------------------

    async def _start(self, episode: Episode) -> None:
        began = time.perf_counter()
        try:
            started = await self.env.start_sample(episode.task, episode.index)
        except ENV_ERRORS as e:
            logger.warning("start_sample(%s, %s) failed: %s", episode.task, episode.index, e)
            episode.lost = str(e) if _lost(e, interact=False) else None
            episode.end(SampleStatus.TASK_ERROR)
            return
        finally:
            episode.env_latency_s += time.perf_counter() - began
        episode.session_id = started.session_id
        if started.finished:  # the task ended while preparing (e.g. ``task error``)
            episode.finished = True
            episode.env_reward = started.reward
            episode.end(started.status)
            return
        episode.messages = list(started.messages)
        episode.tools = list(started.tools or [])
        prompt_ids = await self.loop.run_in_executor(
            None, lambda: self.continuous_token_builder.build_initial_tokens(episode.messages, tools=episode.tools))
        check_episode_tools(self.tokenizer, prompt_ids, episode.tools, f"episode {episode.task}/{episode.index}")
        episode.prompt_ids = list(prompt_ids)
        episode.token_ids = list(prompt_ids)
        if len(prompt_ids) > self.prompt_length or len(prompt_ids) >= self.options.max_total_tokens:
            logger.warning("prompt of %s/%s has %d tokens (rollout.prompt_length=%d, max_total_tokens=%d)",
                           episode.task, episode.index, len(prompt_ids), self.prompt_length,
                           self.options.max_total_tokens)
            episode.end(SampleStatus.AGENT_CONTEXT_LIMIT)

    async def _play(self, episode: Episode, sampling_params: dict[str, Any]) -> None:
        request_id = uuid4().hex
        tool_schemas = [OpenAIFunctionToolSchema.model_validate(t) for t in episode.tools]
        while True:
            budget = min(self.options.max_total_tokens - len(episode.token_ids),
                         self.response_length - len(episode.response_mask))
            if budget <= 0:
                return episode.end(SampleStatus.AGENT_CONTEXT_LIMIT)
            max_tokens = min(self.options.max_new_tokens, budget)
            # Behaviour log-probs are always needed (the PPO ratio is taken against them).
            params = {**sampling_params, "max_tokens": max_tokens, "logprobs": True}
            began = time.perf_counter()
            output = await self.generate(request_id, episode.token_ids, params)
            episode.generate_s += time.perf_counter() - began
            await self._append_generated(episode, output)
            if len(output.token_ids) >= budget:
                return episode.end(SampleStatus.AGENT_CONTEXT_LIMIT)

            message = await self._assistant_message(episode, output.token_ids, tool_schemas)
            began = time.perf_counter()
            try:
                reply = await self.env.interact(episode.session_id, message)
            except ENV_ERRORS as e:
                logger.warning("interact(%s/%s, session %s) failed: %s", episode.task, episode.index,
                               episode.session_id, e)
                episode.lost = str(e) if _lost(e, interact=True) else None
                return episode.end(SampleStatus.TASK_ERROR)
            finally:
                episode.env_latency_s += time.perf_counter() - began
            episode.messages.append(message)
            episode.env_metrics = dict(reply.metrics or {})
            if reply.finish or SampleStatus(reply.status).finished:
                # The controller ended it because its worker went (an extension field): not the policy's doing.
                episode.lost = (reply.metrics or {}).get(ENV_LOST) or None
                episode.finished = True
                episode.env_reward = float(reply.reward)
                return episode.end(SampleStatus(reply.status))
            if episode.turns >= self.options.max_turns:
                return episode.end(SampleStatus.TASK_LIMIT_REACHED)
            if not reply.messages:
                logger.warning("%s/%s: the environment answered 'running' without messages", episode.task,
                               episode.index)
                return episode.end(SampleStatus.TASK_ERROR)
            if not await self._append_env_messages(episode, list(reply.messages)):
                return episode.end(SampleStatus.AGENT_CONTEXT_LIMIT)

    async def _append_generated(self, episode: Episode, output: TokenOutput) -> None:
        if output.log_probs is None or len(output.log_probs) != len(output.token_ids):
            raise RuntimeError(
                f"the rollout server returned {None if output.log_probs is None else len(output.log_probs)} "
                f"log-probs for {len(output.token_ids)} tokens; agentrl_agent needs one behaviour log-prob per "
                "generated token (check the rollout backend's logprobs support)")
        turn_start = len(episode.response_mask)
        merged, mask, logprobs = await self.ct_merge_assistant_token(
            episode.token_ids, output.token_ids, episode.response_mask, episode.response_logprobs,
            assistant_logprobs=list(output.log_probs))
        episode.token_ids, episode.response_mask, episode.response_logprobs = merged.token_ids, mask, logprobs
        episode.turns += 1
        episode.generated_tokens += len(output.token_ids)
        # A generation aborted at a weight update and resumed on the new weights (agentrl.async.interrupt) holds
        # tokens of two versions; the turn log keeps the oldest (cross_policy.started_on).
        oldest, newest = output.extra_fields.get("min_global_steps"), output.extra_fields.get("max_global_steps")
        if oldest is not None and oldest != newest:
            episode.resumed_turns += 1
        episode.turn_log.record(output.extra_fields, start=turn_start, num_tokens=len(mask) - turn_start)

    async def _assistant_message(self, episode: Episode, token_ids: list[int],
                                 tool_schemas: list[OpenAIFunctionToolSchema]) -> Message:
        """Parse one turn's tokens into an OpenAI assistant message, as the model wrote it."""
        ids = token_ids[:-1] if token_ids and token_ids[-1] == self.eos_token_id else token_ids
        content, calls = await self.tool_parser.extract_tool_calls(ids, tool_schemas)
        if not calls:
            # Nothing parsed: send the whole text, so a malformed call reaches the environment verbatim and
            # the environment answers it (e.g. ``agent invalid action``).
            content = await self.loop.run_in_executor(None, self.tokenizer.decode, ids)
        message: Message = {"role": "assistant", "content": content.strip()}
        if calls:
            message["tool_calls"] = [_openai_tool_call(c, f"call_{episode.turns}_{i}") for i, c in enumerate(calls)]
        return message

    async def _append_env_messages(self, episode: Episode, env_messages: list[Message]) -> bool:
        """Append the environment's messages as mask-0 tokens; False (nothing appended) if they do not fit."""
        previous = list(episode.messages)
        updated = previous + env_messages
        merged, mask, logprobs = await self.ct_merge_context_msg(
            previous, updated, episode.token_ids, episode.response_mask, episode.response_logprobs,
            tools=episode.tools)
        # The next turn needs at least one token of room.
        if len(merged.token_ids) >= self.options.max_total_tokens or len(mask) >= self.response_length:
            return False
        episode.env_tokens += len(merged.token_ids) - len(episode.token_ids)
        episode.messages = updated
        episode.token_ids, episode.response_mask, episode.response_logprobs = merged.token_ids, mask, logprobs
        return True

    async def _cancel_if_running(self, episode: Episode) -> None:
        if episode.session_id is None or episode.finished:
            return
        try:
            # Shielded: the cancel must reach the controller even if this episode is being cancelled.
            await asyncio.shield(self.env.cancel(episode.session_id))
        except ENV_ERRORS as e:
            logger.warning("cancel(session %s) failed: %s", episode.session_id, e)

    # ---- output ------------------------------------------------------------------------------------

    async def _output(self, episode: Episode, kwargs: dict[str, Any], *, env_retries: int = 0,
                      env_unavailable_s: float = 0.0) -> AgentLoopOutput:
        if not episode.prompt_ids:
            # The environment never gave a prompt: render the dataset's placeholder so verl has a row.
            prompt_ids = await self.ct_build_initial_tokens(list(kwargs["raw_prompt"]))
            episode.prompt_ids = episode.token_ids = prompt_ids[-self.prompt_length:]
        prompt_ids = episode.prompt_ids[-self.prompt_length:]
        response_ids = episode.token_ids[len(episode.token_ids) - len(episode.response_mask):]
        mask, logprobs = list(episode.response_mask), list(episode.response_logprobs or [])
        if episode.status is SampleStatus.TASK_ERROR:
            mask = [0] * len(mask)  # excluded from the loss and from the advantage statistics
        if not response_ids:
            # verl needs at least one response token; a single masked EOS carries nothing.
            response_ids, mask, logprobs = [self.eos_token_id], [0], [0.0]
        completed = episode.status is SampleStatus.COMPLETED
        reward = episode.env_reward if completed else self.options.penalty
        versions = current_policy_versions(episode.turn_log.versions, episode.turn_log.policies)
        # A trajectory without such turns has no weight version: use the one current at its step.
        fallback_version = int(kwargs.get("global_steps", 1)) - 1
        record = EpisodeRecord(
            task=episode.task,
            status=episode.status.value,
            reward=reward,
            env_reward=episode.env_reward,
            turns=episode.turns,
            env_latency_s=episode.env_latency_s,
            generate_s=episode.generate_s,
            generated_tokens=episode.generated_tokens,
            env_tokens=episode.env_tokens,
            resumed_turns=episode.resumed_turns,
            env_retries=env_retries,
            env_unavailable_s=env_unavailable_s,
            oldest_version=min(versions, default=fallback_version),
            newest_version=max(versions, default=fallback_version),
            turn_log=episode.turn_log,
        )
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            response_mask=mask,
            response_logprobs=logprobs,
            reward_score=reward,
            num_turns=len(episode.messages),
            metrics=AgentLoopMetrics(generate_sequences=episode.generate_s, tool_calls=episode.env_latency_s),
            extra_fields=record.to_extra_fields(),
        )


def _sample_index(kwargs: dict[str, Any]) -> int | str:
    """The sample index from ``extra_info.index`` (numpy scalars become Python values for JSON)."""
    extra_info = kwargs.get("extra_info") or {}
    index = extra_info.get("index", kwargs.get("index"))
    if index is None:
        raise ValueError(f"dataset row of task {kwargs.get('data_source')!r} has no extra_info.index")
    return index.item() if hasattr(index, "item") else index


def _openai_tool_call(call: FunctionCall, default_id: str) -> dict[str, Any]:
    return {
        "id": call.tool_call_id or default_id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }
