"""``agentrl-verl evaluate``: cross-policy evaluation - the ``agentrl_agent`` loop with each turn drawn from a pool of
named OpenAI-compatible endpoints (the paper's inference-time mixing of models).

Every endpoint must serve a model that shares the agent's tokenizer (the loop is token-in/token-out): the
client sends the prompt as token ids to ``/v1/completions`` and asks for the generated token ids back
(``return_tokens_as_token_ids``, as vLLM and SGLang serve them) with their log-probs. The run needs no verl
trainer, Ray or GPU: the same :class:`~agentrl_verl.core.policy_pool.PolicyPoolClient` and agent loop as in training
drive the episodes against an environment controller.

Example::

    agentrl-verl evaluate --model TOKENIZER_DIR --controller http://127.0.0.1:5020 --data val.parquet \\
        --endpoint base=http://127.0.0.1:8000/v1,model=qwen-7b --endpoint other=http://127.0.0.1:8001/v1,weight=0.5

The last line printed is ``key=value`` pairs of the metrics (success rate, share of turns per endpoint, success
rate by share of turns from endpoints other than the first).

:func:`run_episodes` is the one episode runner outside training: the same ``agentrl_agent`` loop (its tool
parser, its chat-template difference between turns, its statuses) drives every evaluation - the endpoint pool
here, and an in-process model (:class:`LocalPolicy`, :func:`evaluate_model`) for the demo's warm-up checks and its
before/after evaluation - so the numbers users read come from the code they train with.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from omegaconf import OmegaConf
from verl.workers.rollout.replica import TokenOutput

from agentrl_verl.core.config import CrossPolicyConfig, Endpoint, agentrl_config
from agentrl_verl.core.cross_policy import PolicyRouter, cross_policy_metrics
from agentrl_verl.core.episode import EpisodeRecord

logger = logging.getLogger(__name__)

TOKEN_ID_PREFIX = "token_id:"
REQUEST_TIMEOUT_S = 600.0


class OpenAIEndpointClient:
    """verl-style ``generate`` (token ids in, token ids and log-probs out) on an OpenAI-compatible completions API.

    Args:
        endpoint: The endpoint (base URL, model name, optional API key variable).
        transport: httpx transport to use instead of the network (e.g. ``httpx.MockTransport``).
    """

    def __init__(self, endpoint: Endpoint, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.endpoint = endpoint
        self.transport = transport
        self._clients: dict[int, httpx.AsyncClient] = {}  # one per event loop (the pool may be used from several)

    def _client(self) -> httpx.AsyncClient:
        loop_id = id(asyncio.get_running_loop())
        if loop_id not in self._clients:
            key = os.environ.get(self.endpoint.api_key_env, "") if self.endpoint.api_key_env else ""
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            self._clients[loop_id] = httpx.AsyncClient(
                timeout=REQUEST_TIMEOUT_S, headers=headers, transport=self.transport
            )
        return self._clients[loop_id]

    async def aclose(self) -> None:
        """Close the HTTP clients of the current event loop."""
        client = self._clients.pop(id(asyncio.get_running_loop()), None)
        if client is not None:
            await client.aclose()

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kwargs: Any
    ) -> TokenOutput:
        """Complete ``prompt_ids``; raises ``RuntimeError`` naming the endpoint if it does not return token ids."""
        body = {
            "model": self.endpoint.model,
            "prompt": [int(t) for t in prompt_ids],
            "max_tokens": sampling_params.get("max_tokens", sampling_params.get("max_new_tokens", 16)),
            "temperature": sampling_params.get("temperature", 1.0),
            "top_p": sampling_params.get("top_p", 1.0),
            "logprobs": 1,
            "return_tokens_as_token_ids": True,
        }
        response = await self._client().post(f"{self.endpoint.base_url.rstrip('/')}/completions", json=body)
        response.raise_for_status()
        choice = response.json()["choices"][0]
        logprobs = choice.get("logprobs") or {}
        tokens = logprobs.get("tokens") or []
        if not all(isinstance(t, str) and t.startswith(TOKEN_ID_PREFIX) for t in tokens) or (
            choice.get("text") and not tokens
        ):
            raise RuntimeError(
                f"endpoint {self.endpoint.name!r} ({self.endpoint.base_url}) did not return generated token ids; "
                "it must support return_tokens_as_token_ids (vLLM, SGLang) and serve the agent's tokenizer"
            )
        finish = choice.get("finish_reason")
        return TokenOutput(
            token_ids=[int(t[len(TOKEN_ID_PREFIX):]) for t in tokens],
            log_probs=[float(lp) for lp in logprobs.get("token_logprobs") or []],
            stop_reason="aborted" if finish == "abort" else "completed",
            extra_fields={"global_steps": None},
        )


def evaluation_config(
    prompt_length: int, response_length: int, env_url: str, agent: dict[str, Any] | None = None,
    tool_format: str = "hermes",
) -> Any:
    """The slice of verl's config that the ``agentrl_agent`` loop reads."""
    return OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"prompt_length": prompt_length, "response_length": response_length,
                                          "multi_turn": {"format": tool_format}}},
        "data": {"apply_chat_template_kwargs": {}},
        "agentrl": {"env": {"url": env_url}, "agent": dict(agent or {})},
    })


async def evaluate(
    rows: Sequence[dict[str, Any]],
    endpoints: Sequence[Endpoint],
    tokenizer: Any,
    config: Any,
    *,
    seed: int = 0,
    sticky: bool = False,
    temperature: float = 1.0,
    concurrency: int = 16,
    hf_model_type: str | None = None,
) -> tuple[dict[str, float], list[Any]]:
    """Run one ``agentrl_agent`` episode per dataset row with turns drawn from ``endpoints``.

    Args:
        rows: Dataset rows (``data_source``, ``extra_info.index``), as ``agentrl-verl make-data`` writes them.
        endpoints: The pool; each endpoint's ``weight`` is its relative probability per turn.
        tokenizer: The agent's tokenizer (shared by every endpoint's model).
        config: :func:`evaluation_config` (or a full verl config).
        seed: Router seed.
        sticky: One endpoint per episode instead of one per turn.
        temperature: Sampling temperature of every turn.
        concurrency: Episodes run at once.
        hf_model_type: The model family (``config.json``'s ``model_type``), for verl's chat-template handling.

    Returns:
        The metrics and the agent loop outputs (in row order).
    """
    from agentrl_verl.core.policy_pool import PolicyPoolClient

    cfg = CrossPolicyConfig(enable=True, endpoints=tuple(endpoints), seed=seed, sticky=sticky)
    clients = {e.name: OpenAIEndpointClient(e) for e in cfg.endpoints}
    pool = PolicyPoolClient(config, clients, PolicyRouter(cfg.endpoint_pool(), seed=seed, sticky=sticky))
    try:
        outputs = await run_episodes(rows, pool, tokenizer, config, {"temperature": temperature, "top_p": 1.0},
                                     concurrency=concurrency, hf_model_type=hf_model_type)
    finally:
        await asyncio.gather(*[client.aclose() for client in clients.values()])
    names = [e.name for e in cfg.endpoints]
    records = [EpisodeRecord.from_extra_fields(out.extra_fields) for out in outputs]
    metrics = cross_policy_metrics(
        [record.turn_log.policies for record in records],
        [record.success for record in records],
        stale_members=names[1:],  # "stale share" = share of turns not from the first (reference) endpoint
        members=names,
        prefix="eval",
    )
    metrics["eval/success_rate"] = sum(record.success for record in records) / max(len(outputs), 1)
    metrics["eval/episodes"] = float(len(outputs))
    return metrics, outputs


async def run_episodes(
    rows: Sequence[Mapping[str, Any]],
    server_manager: Any,
    tokenizer: Any,
    config: Any,
    sampling_params: dict[str, Any],
    *,
    concurrency: int = 16,
    hf_model_type: str | None = None,
) -> list[Any]:
    """Play one ``agentrl_agent`` episode per dataset row, as training does, against ``config.agentrl.env.url``.

    Args:
        rows: Dataset rows (``data_source``, ``extra_info.index``).
        server_manager: What generates each turn: anything with verl's ``generate(request_id=, prompt_ids=,
            sampling_params=)`` returning a ``TokenOutput`` (a policy pool, :class:`LocalPolicy`).
        tokenizer: The policy's tokenizer.
        config: :func:`evaluation_config` (or a full verl config).
        sampling_params: Of every turn (``temperature`` 0 is greedy).
        concurrency: Episodes (environment sessions) at once.
        hf_model_type: The model family (``config.json``'s ``model_type``), for verl's chat-template handling.

    Returns:
        The agent loop outputs, in row order.
    """
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from agentrl_verl.core.agent_loop import AgentRLAgentLoop
    from env_adapters.client import EnvClient

    limit = asyncio.Semaphore(concurrency)
    env_config = agentrl_config(config).env
    env = EnvClient(env_config.url, token=env_config.resolved_token())

    async def episode(row: dict[str, Any]) -> Any:
        async with limit:
            loop = AgentRLAgentLoop(
                trainer_config=DictConfigWrap(config), server_manager=server_manager, tokenizer=tokenizer,
                processor=None, dataset_cls=RLHFDataset, data_config=DictConfigWrap(config.data),
                hf_model_type=hf_model_type, env_client=env,
            )
            # verl's dataset renames ``prompt`` to ``raw_prompt`` (the placeholder the loop falls back to)
            return await loop.run(dict(sampling_params), **{"raw_prompt": list(row.get("prompt", [])), **row})

    try:
        return await asyncio.gather(*[episode(dict(row)) for row in rows])
    finally:
        await env.aclose()


class LocalPolicy:
    """verl's ``generate`` on an in-process transformers model: the ``hf`` rollout engine without a server.

    Args:
        model: A causal LM on its device.
        tokenizer: Its tokenizer (its ``eos_token_id`` ends a turn).
        max_batch_size: Most requests decoded together.
        seed: Seed of the sampling RNG (sampled evaluation is repeatable up to batching order).
    """

    def __init__(self, model: Any, tokenizer: Any, max_batch_size: int = 64, seed: int | None = 0) -> None:
        from agentrl_verl.backends.hf_rollout.engine import HFGenerationEngine

        eos = model.generation_config.eos_token_id
        eos_ids = {*(eos if isinstance(eos, list) else [] if eos is None else [eos]), tokenizer.eos_token_id}
        self.engine = HFGenerationEngine(model, eos_token_ids=eos_ids - {None}, tokenizer=tokenizer,
                                         max_batch_size=max_batch_size, seed=seed)

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **kwargs: Any) -> TokenOutput:
        from agentrl_verl.backends.hf_rollout.sampling import SamplingParams

        params = SamplingParams.from_request(sampling_params, default_max_tokens=64, max_possible_tokens=1 << 30)
        out = await self.engine.generate(request_id, prompt_ids, params)
        return TokenOutput(token_ids=out.token_ids, log_probs=out.log_probs, stop_reason="completed",
                           extra_fields={"global_steps": None})


@dataclass
class EvalResult:
    """Held-out episodes of one task in one evaluation mode (``greedy`` or ``sampled``).

    ``episodes`` are :func:`episode_record` dicts: task, index, status, reward, success, turns and the text.
    """

    task: str
    mode: str
    episodes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def success_rate(self) -> float:
        return sum(e["success"] for e in self.episodes) / max(len(self.episodes), 1)

    @property
    def mean_reward(self) -> float:
        return sum(e["reward"] for e in self.episodes) / max(len(self.episodes), 1)


def episode_record(output: Any, tokenizer: Any, row: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON-ready record of one episode (an agent loop output), its success by
    :func:`~agentrl_verl.core.episode.is_success`."""
    record = EpisodeRecord.from_extra_fields(output.extra_fields)
    return {
        "task": str(row["data_source"]), "index": row["extra_info"]["index"], "status": record.status,
        "reward": float(record.env_reward), "turns": int(record.turns), "success": record.success,
        "text": tokenizer.decode(list(output.prompt_ids) + list(output.response_ids)),
    }


def evaluate_model(
    env_url: str,
    model: Any,
    tokenizer: Any,
    splits: Mapping[str, Sequence[Any]],
    *,
    greedy: bool = True,
    temperature: float = 1.0,
    max_turns: int = 8,
    max_new_tokens: int = 64,
    max_context: int = 1024,
    concurrency: Mapping[str, int] | int = 64,
    seed: int = 0,
) -> dict[str, EvalResult]:
    """Evaluate an in-process model on each task's indices through the environment stack at ``env_url``.

    Args:
        env_url: The controller.
        model: A causal LM (put in eval mode by the engine).
        tokenizer: Its tokenizer.
        splits: ``task -> indices`` to play, one episode each.
        greedy: Greedy decoding, else sampling at ``temperature``.
        temperature: Sampling temperature.
        max_turns: Assistant turns, then ``task limit reached``.
        max_new_tokens: Tokens per turn.
        max_context: Prompt plus response budget, then ``agent context limit``.
        concurrency: Episodes at once, per task (keep it within the task's worker concurrency) or for each; the
            tasks play at once, their turns batched together.
        seed: Sampling seed.

    Returns:
        ``task -> EvalResult``.
    """
    from agentrl_verl.tools.data import make_row

    config = evaluation_config(max_context, max_context, env_url, {
        "max_turns": max_turns, "max_new_tokens": max_new_tokens, "max_total_tokens": max_context})
    params = {"temperature": 0.0 if greedy else temperature, "top_p": 1.0}
    mode = "greedy" if greedy else "sampled"

    async def run() -> dict[str, EvalResult]:
        # Every task at once, through one engine that batches their turns together: the tasks' episodes overlap
        # (one task's slow environment steps leave the model to the others').
        limits = {task: concurrency if isinstance(concurrency, int) else concurrency[task] for task in splits}
        policy = LocalPolicy(model, tokenizer, max_batch_size=sum(limits.values()), seed=seed)
        rows = {task: [make_row(task, i, "eval") for i in indices] for task, indices in splits.items()}
        outputs = await asyncio.gather(*(run_episodes(rows[task], policy, tokenizer, config, params,
                                                      concurrency=limits[task], hf_model_type=model.config.model_type)
                                         for task in splits))
        return {task: EvalResult(task, mode, [episode_record(o, tokenizer, r)
                                              for o, r in zip(outs, rows[task], strict=True)])
                for task, outs in zip(splits, outputs, strict=True)}

    return asyncio.run(run())


def parse_endpoint(text: str) -> Endpoint:
    """``NAME=BASE_URL[,model=M][,weight=W][,api_key_env=VAR]`` -> :class:`Endpoint` (model defaults to NAME)."""
    name, sep, rest = text.partition("=")
    if not sep or not name or not rest:
        raise argparse.ArgumentTypeError(f"--endpoint {text!r}: expected NAME=BASE_URL[,model=M][,weight=W]")
    url, *options = rest.split(",")
    fields: dict[str, Any] = {"name": name, "base_url": url, "model": name}
    for option in options:
        key, _, value = option.partition("=")
        if key not in ("model", "weight", "api_key_env"):
            raise argparse.ArgumentTypeError(f"--endpoint {text!r}: unknown option {key!r}")
        fields[key] = float(value) if key == "weight" else value
    return Endpoint(**fields)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="tokenizer (model directory) shared by every endpoint")
    parser.add_argument("--controller", required=True, help="environment controller URL")
    parser.add_argument("--data", required=True, help="parquet file of dataset rows (agentrl-verl make-data)")
    parser.add_argument("--endpoint", type=parse_endpoint, action="append", required=True,
                        help="NAME=BASE_URL[,model=M][,weight=W][,api_key_env=VAR]; repeat for each pool member")
    parser.add_argument("--seed", type=int, default=0, help="router seed")
    parser.add_argument("--sticky", action="store_true", help="one endpoint per episode instead of per turn")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--prompt-length", type=int, default=4096)
    parser.add_argument("--response-length", type=int, default=8192)
    parser.add_argument("--max-turns", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=1024)


def run(args: argparse.Namespace) -> int:
    import pandas as pd
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model_type = AutoConfig.from_pretrained(args.model).model_type
    rows = pd.read_parquet(args.data).to_dict(orient="records")
    config = evaluation_config(args.prompt_length, args.response_length, args.controller,
                               {"max_turns": args.max_turns, "max_new_tokens": args.max_new_tokens})
    metrics, _ = asyncio.run(evaluate(rows, args.endpoint, tokenizer, config, seed=args.seed, sticky=args.sticky,
                                      temperature=args.temperature, concurrency=args.concurrency,
                                      hf_model_type=model_type))
    logger.info("evaluation metrics: %s", json.dumps(metrics, indent=1, sort_keys=True))
    print(" ".join(f"{k}={v:g}" for k, v in sorted(metrics.items())))  # the command's result line
    return 0
