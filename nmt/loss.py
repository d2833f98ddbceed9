"""The training losses' vocabulary terms: `VocabTerms`, what a loss reads of the (N, V)
logits with one (N, V) gradient backward, and the two losses built on it, the plain model's
`cross_entropy` (label smoothing included) and, in `nmt.copy`, the copy mixture's.

Why not `F.cross_entropy` for the plain loss: it needs float32 logits, so bf16 ones were
cast (an (N, V) copy) and log-softmaxed (another), and its backward wrote the log-softmax's
gradient and then the cast's. Through `VocabTerms` the float32 log-probabilities are
written once and become the gradient in place (1,024 × 8,000 alone, forward + backward,
freed memory kept, 2 cores of a Xeon with AMX: 17.5 → 10.5 ms in bf16, 13.8 → 6.2 in fp32;
a reference-model update, same batches alternated: 0.979-0.982× the time in bf16,
0.982-0.992× in fp32; session 30). Sessions 16-21 dropped other hand fusions and chunked
versions, for gains of 2 % or less, each a new piece of code; this one is the copy loss's.

Shape legend: N rows (target tokens, padding included), V vocabulary, K ids read a row.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from nmt.tokenizer import PAD_ID


class VocabTerms(torch.autograd.Function):
    """What a loss reads of the vocabulary logits (N, V), in float32: their logsumexp (N,),
    their sum (N,) and their values at K ids a row (N, K).

    Why a Function: autograd through a log-softmax, a sum and two gathers writes four (N, V)
    gradients and adds them up. This one keeps the float32 log-softmax of the forward and
    turns it into the one gradient in place:
    softmax · g_lse + g_total, then the K ids' terms added.
    """

    @staticmethod
    def forward(ctx: Any, logits: Tensor, ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        ctx.dtype = logits.dtype
        # One cast, then float32 kernels: log_softmax and sum reading bf16 themselves are
        # slower than the cast and their float32 selves (1,024 × 8,000, 2 cores of a Xeon
        # with AMX: 5.4 and 2.0 ms against 1.1 + 3.2 and 0.7)
        logits = logits.float()  # (N, V)
        log_p = torch.log_softmax(logits, -1)  # (N, V)
        at = logits.gather(-1, ids)  # (N, K)
        lse = at[:, 0] - log_p.gather(-1, ids[:, :1]).squeeze(-1)  # (N,) x_k − log p_k
        ctx.save_for_backward(log_p, ids)
        return lse, logits.sum(-1), at  # (N,), (N,), (N, K)

    @staticmethod
    def backward(ctx: Any, g_lse: Tensor, g_total: Tensor, g_at: Tensor) -> tuple[Tensor, None]:
        log_p, ids = ctx.saved_tensors
        grad = log_p.exp_()  # (N, V) softmax, in the saved tensor's memory (used once)
        grad.mul_(g_lse.unsqueeze(-1)).add_(g_total.unsqueeze(-1))
        grad.scatter_add_(-1, ids, g_at)
        return grad.to(ctx.dtype), None


def cross_entropy(logits: Tensor, target: Tensor, label_smoothing: float) -> Tensor:
    """Summed cross entropy with label smoothing over the non-pad targets, in float32:
    (1 − ε) (lse − x_y) + ε (lse − Σ_w x_w / V) a row, which is `F.cross_entropy(logits,
    target, ignore_index=PAD_ID, label_smoothing=ε, reduction="sum")`.

    logits (N, V) any float dtype; target (N,) int64 -> scalar float32.
    """
    eps, vocab = label_smoothing, logits.size(-1)
    lse, total, at = VocabTerms.apply(logits, target.unsqueeze(-1))  # (N,), (N,), (N, 1)
    rows = lse - (1 - eps) * at.squeeze(-1) - (eps / vocab) * total  # (N,)
    return rows.masked_fill(target == PAD_ID, 0.0).sum()
