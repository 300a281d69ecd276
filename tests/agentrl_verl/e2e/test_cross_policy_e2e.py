"""Cross-policy sampling in verl's real ``main_ppo`` on CPU: tiny model, ``hf`` rollout, ``agentrl_agent`` loop.

One environment stack (the multi-turn ``chatter`` test task) serves every run. Each run is a subprocess with its
own Ray cluster; per-step metrics come from verl's ``file`` logger (JSON lines).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from agentrl_verl.core.cross_policy import stale_version
from agentrl_verl.core.episode import EpisodeRecord
from agentrl_verl.models.tiny import build_tiny_model
from agentrl_verl.tools.data import make_row

pytestmark = pytest.mark.slow

RUN_TIMEOUT_S = 540
TASK = "chatter"
K = 2


@pytest.fixture(scope="module")
def env_url(start_stack):
    with start_stack([{"task": "chatter_task:ChatterTask", "name": TASK, "concurrency": 64,
                       "options": {"rounds": 3}}]) as stack:
        yield stack.url


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    import pandas as pd

    root = tmp_path_factory.mktemp("cross_policy_e2e")
    pd.DataFrame([make_row(TASK, i, "train") for i in range(32)]).to_parquet(root / "train.parquet")
    pd.DataFrame([make_row(TASK, i, "val") for i in range(32, 36)]).to_parquet(root / "val.parquet")
    return root


@pytest.fixture(scope="module")
def run(main_ppo):
    def run(workdir: Path, env_url: str, name: str, *overrides: str) -> list[dict]:
        """Run main_ppo (agentrl_sync trainer, agentrl_agent loop); return the logged metrics of each step."""
        metrics_file = workdir / f"{name}.jsonl"
        main_ppo(
            workdir, build_tiny_model(), name,
            "data.max_prompt_length=96", "data.max_response_length=96", "data.seed=0",
            "actor_rollout_ref.actor.optim.lr=5e-3",
            "trainer.v1.trainer_mode=agentrl_sync", "trainer.logger=[console,file]",
            f"+agentrl.env.url={env_url}", "+agentrl.agent.max_turns=3", "+agentrl.agent.max_new_tokens=8",
            *overrides,
            timeout_s=RUN_TIMEOUT_S, env={"VERL_FILE_LOGGER_PATH": str(metrics_file)},
        )
        return [json.loads(line)["data"] for line in metrics_file.read_text().splitlines()]

    return run


CROSS_POLICY = (
    "+agentrl.cross_policy.enable=true", f"+agentrl.cross_policy.stale_refresh_steps={K}",
    "+agentrl.cross_policy.stale_replicas=1",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=ray_object_store",
    "ray_kwargs.ray_init.num_gpus=2",  # one logical device for the trainer, one for the stale replica
)


def test_half_stale_mixes_pools_and_stale_weights_lag_at_most_k(workdir, env_url, run):
    steps = run(workdir, env_url, "ratio_half", *CROSS_POLICY, "+agentrl.cross_policy.stale_ratio=0.5",
                "trainer.total_training_steps=3")
    assert len(steps) == 3
    assert any(m["actor/grad_norm"] > 0 for m in steps)  # the actor really moves, so versions differ in weights
    for step, m in enumerate(steps, start=1):
        # Both pools served turns, and single trajectories mix them.
        assert 0 < m["cross_policy/turn_share/stale"] < 1, m
        assert m["cross_policy/mixed_trajectory_share"] > 0
        # Versions reported by the servers: current turns come from the actor's last weights (step - 1); stale
        # turns from the last refresh, at most K - 1 behind, and equal again right after each refresh.
        assert m["cross_policy/version_lag_max/current"] == 0
        assert m["cross_policy/version_lag_max/stale"] == (step - 1) - stale_version(step - 1, K)
        assert m["cross_policy/stale_version"] == stale_version(step, K)
        assert m["cross_policy/stale_version_lag"] == step % K
    lags = [m["cross_policy/version_lag_max/stale"] for m in steps]
    assert lags == [0, 1, 0]  # lags K - 1 = 1 step, then catches up
    # The weights, not just the version labels: verl compares every token's behaviour log-prob with the actor's
    # recomputation. Where no stale turn lags, they agree to float noise; where stale turns are one update behind
    # (and that update changed the actor), they differ.
    for step, m in enumerate(steps, start=1):
        if lags[step - 1] == 0:
            assert m["training/rollout_probs_diff_max"] < 2e-4, step
        elif steps[step - 2]["actor/grad_norm"] > 0:
            assert m["training/rollout_probs_diff_max"] > 2e-4, step


# ---- training with a fixed other model as the pool's second member -------------------------------------------


@pytest.fixture(scope="module")
def uniform_model(tmp_path_factory) -> tuple[Path, int]:
    """The tiny model with its output layer zeroed (tied to the embedding): every logit is 0, so every token it
    samples has log-prob exactly -log(vocab size). Returns its directory and vocab size."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = build_tiny_model()
    model = AutoModelForCausalLM.from_pretrained(source, torch_dtype="float32")
    with torch.no_grad():
        model.get_output_embeddings().weight.zero_()
    path = tmp_path_factory.mktemp("tiny_uniform")
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(source).save_pretrained(path)
    return path, model.config.vocab_size


def test_fixed_model_serves_turns_with_its_own_logprobs_and_is_never_synced(workdir, env_url, run, uniform_model):
    path, vocab_size = uniform_model
    # The naive checkpoint engine: nothing reaches the fixed replica, which loads its weights from the path.
    steps = run(workdir, env_url, "fixed", "+agentrl.cross_policy.enable=true",
                f"+agentrl.cross_policy.fixed_model_path={path}", "+agentrl.cross_policy.stale_ratio=0.5",
                "ray_kwargs.ray_init.num_gpus=2", "trainer.total_training_steps=3")
    assert len(steps) == 3
    assert any(m["actor/grad_norm"] > 0 for m in steps)  # the actor moves; the fixed model must not
    uniform = -math.log(vocab_size)
    for step, m in enumerate(steps, start=1):
        assert 0 < m["cross_policy/turn_share/fixed"] < 1, m
        assert m["cross_policy/mixed_trajectory_share"] > 0
        # Every behaviour log-prob of the fixed member's turns is the uniform model's, at every step.
        assert m["cross_policy/logprob_mean/fixed"] == pytest.approx(uniform, abs=1e-5), step
        # No stale member, no weight sync, and no weight version for the fixed model.
        assert not [key for key in m if key.endswith("/stale") or "stale_version" in key], step
        assert not [key for key in m if "version_lag" in key and key.endswith("/fixed")], step
        assert "timing_s/update_stale_weights" not in m
    # The current policy's turns are not the uniform model's.
    assert any(abs(m["cross_policy/logprob_mean/current"] - uniform) > 1e-4 for m in steps)


# ---- evaluation: two different models behind OpenAI-compatible endpoints, mixed per turn -------------------


class CompletionsServer:
    """A minimal OpenAI-compatible ``/v1/completions`` server (token-id prompts, vLLM's token-id outputs)."""

    def __init__(self, model_dir: Path) -> None:
        import threading
        import uuid

        import uvicorn
        from fastapi import FastAPI
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from agentrl_verl.backends.hf_rollout.engine import HFGenerationEngine
        from agentrl_verl.backends.hf_rollout.sampling import SamplingParams

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype="float32")
        engine = HFGenerationEngine(self.model, eos_token_ids=[tokenizer.eos_token_id], seed=0)
        app = FastAPI()

        @app.post("/v1/completions")
        async def completions(body: dict) -> dict:
            params = SamplingParams(max_tokens=body["max_tokens"], temperature=body["temperature"],
                                    top_p=body["top_p"], logprobs=True)
            out = await engine.generate(uuid.uuid4().hex, body["prompt"], params)
            return {"choices": [{"text": tokenizer.decode(out.token_ids), "finish_reason": out.finish_reason,
                                 "logprobs": {"tokens": [f"token_id:{t}" for t in out.token_ids],
                                              "token_logprobs": out.log_probs}}]}

        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            self.thread.join(0.05)
        self.url = f"http://127.0.0.1:{self.server.servers[0].sockets[0].getsockname()[1]}/v1"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def two_models(tmp_path_factory) -> tuple[Path, Path]:
    """Two tiny models with different weight seeds and the same tokenizer (the loop is token-in/token-out)."""
    from transformers import AutoTokenizer

    from agentrl_verl.models.tiny import TinyModelSpec, build_model

    first = build_tiny_model()
    tokenizer = AutoTokenizer.from_pretrained(first)
    second = tmp_path_factory.mktemp("tiny_seed1")
    build_model(TinyModelSpec(seed=1), tokenizer).save_pretrained(second)
    tokenizer.save_pretrained(second)
    return first, second


def _token_logprobs(model, ids: list[int], positions: range) -> list[float]:
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return [logprobs[p - 1, ids[p]].item() for p in positions]


async def test_evaluation_mixes_two_models_per_turn(env_url, two_models):
    from transformers import AutoTokenizer

    from agentrl_verl.core.config import Endpoint
    from agentrl_verl.tools.evaluate import evaluate, evaluation_config

    servers = [CompletionsServer(path) for path in two_models]
    try:
        endpoints = [Endpoint("seed0", servers[0].url, "tiny0"), Endpoint("seed1", servers[1].url, "tiny1")]
        tokenizer = AutoTokenizer.from_pretrained(two_models[0])
        config = evaluation_config(256, 256, env_url, {"max_turns": 3, "max_new_tokens": 8})
        rows = [make_row(TASK, i, "val") for i in range(12)]
        metrics, outputs = await evaluate(rows, endpoints, tokenizer, config, seed=1, hf_model_type="qwen2")
        models = {"seed0": servers[0].model, "seed1": servers[1].model}
        assert metrics["eval/episodes"] == 12
        assert 0 < metrics["eval/turn_share/seed0"] < 1 and 0 < metrics["eval/turn_share/seed1"] < 1
        assert metrics["eval/mixed_trajectory_share"] > 0
        # Each turn's behaviour log-probs are those of the model that generated it, not of the other one.
        checked = 0
        for out in outputs:
            log = EpisodeRecord.of(out).turn_log
            ids = out.prompt_ids + out.response_ids
            for policy, (start, end) in zip(log.policies, log.spans, strict=True):
                positions = range(len(out.prompt_ids) + start, len(out.prompt_ids) + end)
                own = _token_logprobs(models[policy], ids, positions)
                other = _token_logprobs(models["seed1" if policy == "seed0" else "seed0"], ids, positions)
                assert out.response_logprobs[start:end] == pytest.approx(own, abs=1e-3)
                assert out.response_logprobs[start:end] != pytest.approx(other, abs=1e-3)
                checked += 1
        assert checked >= 12
    finally:
        for server in servers:
            server.stop()
