"""Token log-probabilities over chunks of rows, for verl's path without flash-attn's cross-entropy kernel.

verl's ``logprobs_from_logits`` (``verl/utils/torch_functional.py``) takes flash-attn's Triton cross-entropy where
flash-attn is installed, and otherwise ``logprobs_from_logits_v2``, which loops over the first dimension of the
logits one row at a time to bound peak memory. The actor's logits arrive with padding removed, ``(tokens, vocab)``,
so that loop runs one kernel and one autograd node per token, forward and backward: on one H100 the demo's actor
update (64 sequences, about 9,000 tokens) spent most of its 1.8 s there. :func:`chunked_logprobs` does the same
arithmetic (``x[label] - logsumexp(x)`` in fp32/fp64, ``log_softmax`` in lower precision, as verl) over chunks of
rows of at most :data:`CHUNK_ELEMENTS` logits: the memory bound stays, the kernels are a handful.

:func:`register` puts it in place of ``logprobs_from_logits_v2`` (which verl calls through its module's globals) in
every process that imports that module; where flash-attn is installed verl never calls either. The member is listed in
:mod:`agentrl_verl.core.verl_seam`. ``bench/logprobs.py`` times both on a device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from verl.utils import torch_functional

VERL_LOGPROBS = torch_functional.logprobs_from_logits_v2
"""verl's own row-by-row function, as the module had it before :func:`register` (for ``bench/logprobs.py`` and the
tests)."""
CHUNK_ELEMENTS = 1 << 24
"""Most logits a chunk holds: its temporaries (``exp`` in ``logsumexp``, its gradient) are 64 MiB in fp32, against
the gigabytes of a large vocabulary's logits themselves."""


def chunked_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The log-probability of each label under ``logits``, computed over chunks of rows.

    Args:
        logits: ``(rows, vocab)`` or ``(rows, seq, vocab)``.
        labels: Token ids, ``logits``' shape without its last dimension.

    Returns:
        Log-probabilities of ``labels``, shaped like them, in ``logits``' dtype.
    """
    if logits.shape[0] == 0:
        return logits.new_zeros(labels.shape)
    rows = max(1, CHUNK_ELEMENTS // max(1, logits[0].numel()))
    parts = []
    for chunk, chunk_labels in zip(logits.split(rows), labels.split(rows), strict=True):
        index = chunk_labels.unsqueeze(-1)
        if chunk.dtype in (torch.float32, torch.float64):
            parts.append(chunk.gather(-1, index).squeeze(-1) - torch.logsumexp(chunk, dim=-1))
        else:  # logsumexp is unstable in bfloat16: verl takes log_softmax there, and so does this
            parts.append(F.log_softmax(chunk, dim=-1).gather(-1, index).squeeze(-1))
    return torch.cat(parts)


def register() -> None:
    """Called by :mod:`agentrl_verl.plugin` (also in every Ray worker): puts :func:`chunked_logprobs` in place of
    verl's row-by-row ``logprobs_from_logits_v2`` (idempotent)."""
    torch_functional.logprobs_from_logits_v2 = chunked_logprobs


register()  # importing the module registers it: agentrl_verl.plugin imports it with its verl module
