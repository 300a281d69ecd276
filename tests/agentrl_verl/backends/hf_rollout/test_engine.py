"""The hf generation engine against plain transformers: greedy parity, log-probs, batching, prefix cache, abort."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl_verl.backends.hf_rollout.engine import HFGenerationEngine, PrefixCache
from agentrl_verl.backends.hf_rollout.sampling import SamplingParams, sample_tokens
from agentrl_verl.models.tiny import build_tiny_model

GREEDY = SamplingParams(max_tokens=12, temperature=0, logprobs=True)


@pytest.fixture(scope="module")
def tiny():
    path = build_tiny_model()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, tokenizer


@pytest.fixture(scope="module")
def prompts(tiny):
    _, tokenizer = tiny
    # Different lengths, so the batch really is left-padded.
    texts = [f"What is {a} plus {b}?" + " Think." * (a % 4) for a, b in [(12, 7), (33, 41), (5, 90), (70, 3)]]
    return [list(tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                               tokenize=True)["input_ids"]) for t in texts]


def generate_reference(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def forward_logprobs(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def make_engine(model, **kwargs) -> HFGenerationEngine:
    return HFGenerationEngine(model, eos_token_ids=[], **kwargs)


async def test_greedy_matches_model_generate_and_logprobs_match_forward(tiny, prompts):
    model, _ = tiny
    engine = make_engine(model)
    for i, prompt in enumerate(prompts[:2]):
        out = await engine.generate(f"r{i}", prompt, GREEDY)
        assert out.token_ids == generate_reference(model, prompt, 12)
        assert out.finish_reason == "length"
        torch.testing.assert_close(torch.tensor(out.log_probs), forward_logprobs(model, prompt, out.token_ids),
                                   atol=1e-5, rtol=0)


async def test_concurrent_requests_equal_serial_ones(tiny, prompts):
    model, _ = tiny
    serial_engine = make_engine(model, prefix_cache_entries=0)
    longest = SamplingParams(max_tokens=16, temperature=0, logprobs=True)
    serial = [await serial_engine.generate(f"s{i}", p, longest) for i, p in enumerate(prompts)]
    engine = make_engine(model, prefix_cache_entries=0)
    # Different max_tokens: rows leave the batch at different steps while others keep decoding.
    params = [SamplingParams(max_tokens=4 + 3 * i, temperature=0, logprobs=True) for i in range(len(prompts))]
    concurrent = await asyncio.gather(*[engine.generate(f"c{i}", p, sp) for i, (p, sp) in
                                        enumerate(zip(prompts, params, strict=True))])
    for s, c, sp in zip(serial, concurrent, params, strict=True):
        assert c.token_ids == s.token_ids[: sp.max_tokens]
        torch.testing.assert_close(torch.tensor(c.log_probs), torch.tensor(s.log_probs[: sp.max_tokens]),
                                   atol=1e-4, rtol=0)
    assert engine.num_running == 0 and engine.num_waiting == 0


async def test_new_requests_are_prefilled_as_one_batch_and_identical_prompts_once(tiny, prompts):
    model, _ = tiny
    engine = make_engine(model)
    forwards = []
    hook = model.register_forward_pre_hook(lambda module, args, kwargs: forwards.append(kwargs["input_ids"].shape),
                                           with_kwargs=True)
    group = [prompts[0]] * 3 + [prompts[1]]  # a GRPO-like group of one prompt, and another prompt
    try:
        outs = await asyncio.gather(*[engine.generate(f"g{i}", p, GREEDY) for i, p in enumerate(group)])
    finally:
        hook.remove()
    # One forward prefilled the two distinct prompts (left-padded to the longer); decode steps feed one token a row.
    assert forwards[0] == (2, max(len(prompts[0]), len(prompts[1]))) and all(f[1] == 1 for f in forwards[1:])
    assert [o.num_cached_tokens for o in outs] == [0, len(prompts[0]), len(prompts[0]), 0]
    assert [o.token_ids for o in outs] == [generate_reference(model, p, 12) for p in group]


async def test_decodes_many_steps_per_worker_call_and_masks_only_a_padded_batch(tiny, prompts):
    model, _ = tiny
    engine = make_engine(model, prefix_cache_entries=0)
    steps, masks = [], []  # rows admitted per worker call; attention mask of each decode forward
    step = engine._step
    engine._step = lambda admitted: steps.append(len(admitted)) or step(admitted)
    hook = model.register_forward_pre_hook(
        lambda module, args, kwargs: masks.append(kwargs["attention_mask"]) if kwargs["input_ids"].shape[1] == 1
        else None, with_kwargs=True)
    same_length = [prompts[0][:-1] + [i + 5] for i in range(3)]
    try:
        same = await asyncio.gather(*[engine.generate(f"s{i}", p, GREEDY) for i, p in enumerate(same_length)])
        assert steps == [3]  # prefill and all 11 decode steps in one worker call: no finish, nobody waiting
        assert len(masks) == 11 and all(m is None for m in masks)  # no padding: no mask
        masks.clear()
        await asyncio.gather(*[engine.generate(f"p{i}", p, GREEDY) for i, p in enumerate(prompts[:2])])
        assert len(masks) == 11 and all(m is not None and not m.all() for m in masks)
    finally:
        hook.remove()
    assert [o.token_ids for o in same] == [generate_reference(model, p, 12) for p in same_length]


async def test_request_arriving_mid_decode_joins_the_running_batch(tiny, prompts):
    model, _ = tiny
    engine = make_engine(model)
    long = asyncio.create_task(engine.generate("long", prompts[0], SamplingParams(max_tokens=10_000, temperature=0)))
    while engine.num_running < 1:
        await asyncio.sleep(0.01)
    short = await engine.generate("short", prompts[1], GREEDY)
    assert not long.done()  # the short request did not wait for the long one to finish
    assert short.token_ids == generate_reference(model, prompts[1], 12)
    await engine.abort_all()
    assert (await long).finish_reason == "abort"


async def test_requests_beyond_max_batch_size_wait_and_complete(tiny, prompts):
    model, _ = tiny
    engine = make_engine(model, max_batch_size=2)
    outs = await asyncio.gather(*[engine.generate(f"w{i}", p, GREEDY) for i, p in enumerate(prompts)])
    assert [o.token_ids for o in outs] == [generate_reference(model, p, 12) for p in prompts]


async def test_next_turn_reuses_prefix_cache_and_matches_uncached(tiny, prompts):
    model, _ = tiny
    engine = make_engine(model)
    first = await engine.generate("t1", prompts[0], GREEDY)
    turn2 = prompts[0] + first.token_ids + prompts[1]
    cached = await engine.generate("t2", turn2, GREEDY)
    # Everything but the first turn's last token (never fed to the model) came from the cache.
    assert cached.num_cached_tokens == len(prompts[0]) + len(first.token_ids) - 1
    assert cached.token_ids == generate_reference(model, turn2, 12)
    await engine.clear_cache()
    again = await engine.generate("t3", turn2, GREEDY)
    assert again.num_cached_tokens == 0 and again.token_ids == cached.token_ids


async def test_stop_token_eos_and_stop_string(tiny, prompts):
    model, tokenizer = tiny
    sampled = SamplingParams(max_tokens=12, temperature=1.0)
    # Seeded sampling makes the same continuation each time (greedy output of a random model just repeats).
    reference = (await HFGenerationEngine(model, eos_token_ids=[], seed=0).generate("r", prompts[0], sampled)).token_ids
    stop_at = reference.index(reference[3])
    engine = HFGenerationEngine(model, eos_token_ids=[reference[3]], tokenizer=tokenizer, seed=0)
    out = await engine.generate("e", prompts[0], sampled)
    assert out.token_ids == reference[: stop_at + 1] and out.finish_reason == "stop"
    engine = HFGenerationEngine(model, eos_token_ids=[reference[3]], tokenizer=tokenizer, seed=0)
    ignore = await engine.generate("i", prompts[0], SamplingParams(max_tokens=12, temperature=1.0, ignore_eos=True))
    assert ignore.token_ids == reference and ignore.log_probs is None
    stop_text = tokenizer.decode(reference[5:7])
    engine = HFGenerationEngine(model, eos_token_ids=[], tokenizer=tokenizer, seed=0)
    out = await engine.generate("s", prompts[0], SamplingParams(max_tokens=12, temperature=1.0, stop=(stop_text,)))
    assert out.finish_reason == "stop" and stop_text in tokenizer.decode(out.token_ids)
    assert len(out.token_ids) <= 7


async def test_abort_all_returns_partial_outputs(tiny, prompts):
    model, _ = tiny
    engine = make_engine(model)
    long = SamplingParams(max_tokens=10_000, temperature=1.0)
    tasks = [asyncio.create_task(engine.generate(f"a{i}", p, long)) for i, p in enumerate(prompts)]
    while engine.num_running < len(prompts):
        await asyncio.sleep(0.01)
    aborted = await engine.abort_all()
    outs = await asyncio.gather(*tasks)
    assert sorted(aborted) == sorted(f"a{i}" for i in range(len(prompts)))
    assert all(o.finish_reason == "abort" and 0 < len(o.token_ids) < 10_000 for o in outs)
    # The engine keeps serving afterwards.
    assert (await engine.generate("after", prompts[0], GREEDY)).token_ids == generate_reference(model, prompts[0], 12)


async def test_load_weights_changes_outputs_and_rejects_unknown_names(tiny, prompts):
    model, _ = tiny
    path = build_tiny_model()
    fresh = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    engine = make_engine(fresh)
    before = await engine.generate("b", prompts[0], GREEDY)
    perturbed = {k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()}
    loaded = await engine.load_weights(perturbed.items())
    assert loaded == len(fresh.state_dict())
    after = await engine.generate("a", prompts[0], GREEDY)
    assert after.token_ids != before.token_ids
    with pytest.raises(KeyError, match="not_a_weight"):
        await engine.load_weights([("not_a_weight", torch.zeros(1))])


def test_sampling_respects_top_k_and_greedy_rows():
    logits = torch.tensor([[0.0, 5.0, 4.9, -1.0]] * 2000)
    params = [SamplingParams(max_tokens=1, temperature=1.0, top_k=2)] * 1000 + [SamplingParams(max_tokens=1,
                                                                                               temperature=0)] * 1000
    tokens, logprobs = sample_tokens(logits, params, torch.Generator().manual_seed(0))
    assert set(tokens[:1000].tolist()) == {1, 2}
    assert set(tokens[1000:].tolist()) == {1}
    torch.testing.assert_close(logprobs[1000], torch.log_softmax(logits[0], -1)[1])


def test_sampling_params_from_request():
    sp = SamplingParams.from_request({"temperature": 0.5, "max_new_tokens": 50, "logprobs": True, "stop": "x",
                                      "repetition_penalty": 1.0}, default_max_tokens=8, max_possible_tokens=20)
    assert (sp.max_tokens, sp.temperature, sp.stop, sp.logprobs) == (20, 0.5, ("x",), True)
    assert SamplingParams.from_request({}, default_max_tokens=8, max_possible_tokens=20).max_tokens == 8
    with pytest.raises(ValueError, match="repetition_penalty"):
        SamplingParams.from_request({"repetition_penalty": 1.2}, 8, 20)
    with pytest.raises(ValueError, match="unknown sampling params"):
        SamplingParams.from_request({"beam_width": 4}, 8, 20)


def test_prefix_cache_longest_common_prefix_and_lru():
    kv = [(torch.arange(5.0).view(1, 1, 5, 1), torch.arange(5.0).view(1, 1, 5, 1))]
    cache = PrefixCache(max_entries=1)
    cache.put([1, 2, 3, 4, 5], kv)
    hit, cropped = cache.lookup([1, 2, 3, 9], max_len=3)
    assert hit == 3 and cropped[0][0].shape[-2] == 3
    cache.put([7, 8], kv)  # evicts the first entry
    assert cache.lookup([1, 2, 3], max_len=2) == (0, None)
