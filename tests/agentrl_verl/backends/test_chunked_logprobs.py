"""chunked_logprobs: verl's log-probs from logits (no flash-attn) over chunks of rows, the same values and gradients."""

import pytest
import torch
from verl.utils import torch_functional

from agentrl_verl.backends import chunked_logprobs as module
from agentrl_verl.backends.chunked_logprobs import VERL_LOGPROBS, chunked_logprobs


def _inputs(shape: tuple[int, ...], vocab: int, dtype: torch.dtype, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(*shape, vocab, generator=generator)).to(dtype).requires_grad_()
    labels = torch.randint(0, vocab, shape, generator=generator)
    return logits, labels


def _value_and_grad(fn, logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out = fn(logits, labels)
    weights = torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(out.dtype)
    (grad,) = torch.autograd.grad((out * weights).sum(), logits)
    return out.detach(), grad


@pytest.mark.parametrize("shape", [(37,), (5, 11)], ids=["tokens-by-vocab", "rows-by-seq-by-vocab"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_chunks_give_verls_values_and_gradients(monkeypatch, shape, dtype):
    monkeypatch.setattr(module, "CHUNK_ELEMENTS", 3 * 50 * (shape[1] if len(shape) > 1 else 1))  # several chunks
    logits, labels = _inputs(shape, 50, dtype)
    ours, our_grad = _value_and_grad(chunked_logprobs, logits, labels)
    verls, verl_grad = _value_and_grad(VERL_LOGPROBS, logits, labels)
    assert ours.shape == labels.shape and ours.dtype == dtype
    tolerance = {"atol": 1e-2, "rtol": 1e-2} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}
    torch.testing.assert_close(ours, verls, **tolerance)
    torch.testing.assert_close(our_grad, verl_grad, **tolerance)
    exact = torch.log_softmax(logits.detach().double(), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(ours.double(), exact, **tolerance)


def test_a_chunk_holds_at_most_the_bound(monkeypatch):
    sizes = []
    real_logsumexp = torch.logsumexp

    def logsumexp(chunk, dim):
        sizes.append(chunk.numel())
        return real_logsumexp(chunk, dim=dim)

    monkeypatch.setattr(module, "CHUNK_ELEMENTS", 1000)
    monkeypatch.setattr(module.torch, "logsumexp", logsumexp)
    logits, labels = _inputs((103,), 64, torch.float32)
    chunked_logprobs(logits, labels)
    assert sizes == [15 * 64] * 6 + [13 * 64]  # 1000 // 64 = 15 rows a chunk
    sizes.clear()
    chunked_logprobs(*_inputs((3,), 4000, torch.float32))  # a row over the bound is a chunk of its own
    assert sizes == [4000] * 3


def test_no_rows():
    logits, labels = _inputs((0,), 8, torch.float32)
    out = chunked_logprobs(logits, labels)
    assert out.shape == (0,) and out.dtype == torch.float32


def test_verls_entry_point_takes_it_without_flash_attn():
    """The plugin replaced verl's fallback; verl's public function returns the chunked result (flash-attn absent)."""
    assert not torch_functional.FLAH_ATTN_CROSS_ENTROPY_LOSS_AVAILABLE
    assert torch_functional.logprobs_from_logits_v2 is chunked_logprobs
    logits, labels = _inputs((9,), 16, torch.float32)
    torch.testing.assert_close(torch_functional.logprobs_from_logits(logits, labels),
                               chunked_logprobs(logits, labels))
