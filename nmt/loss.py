"""Cross entropy over the vocabulary without building what autograd would: one pass over
the (N, V) logits forward (their logsumexp, sum and values at a few ids), one (N, V)
gradient backward. `cross_entropy` is the plain model's training loss, label smoothing
included; `nmt.copy.copy_loss` reads the same `VocabTerms` for the copy mixture.

Why: `F.cross_entropy(..., label_smoothing=ε)` in float32 materialises the (N, V)
log-probabilities and adds the smoothing term's gradient as a second (N, V) pass; at 8,000
to 10,000 target pieces the output layer and its loss are the largest part of a step on a
CPU (issue 25's profile: 16 % for the log-softmax alone). The fused form computes the same
values (tests/test_loss.py holds it to F.cross_entropy's values and gradients).

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
    gradients and adds them up, about a sixth of a training step here. This backward writes
    one, as cross entropy's own does: softmax · g_lse + g_sum, then the K ids' terms added
    in place.
    """

    @staticmethod
    def forward(ctx: Any, logits: Tensor, ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        x = logits.float()
        lse = torch.logsumexp(x, -1)  # (N,)
        ctx.save_for_backward(logits, lse, ids)
        return lse, x.sum(-1), x.gather(-1, ids)  # (N,), (N,), (N, K)

    @staticmethod
    def backward(ctx: Any, g_lse: Tensor, g_total: Tensor, g_at: Tensor) -> tuple[Tensor, None]:
        logits, lse, ids = ctx.saved_tensors
        grad = (logits.float() - lse.unsqueeze(-1)).exp_()  # (N, V) softmax
        grad.mul_(g_lse.unsqueeze(-1)).add_(g_total.unsqueeze(-1))
        grad.scatter_add_(-1, ids, g_at)
        return grad.to(logits.dtype), None


def cross_entropy(logits: Tensor, target: Tensor, label_smoothing: float) -> Tensor:
    """Summed cross entropy with label smoothing over the non-pad targets, as
    `F.cross_entropy(logits.float(), target, ignore_index=PAD_ID, label_smoothing=ε,
    reduction="sum")` computes it: (1 − ε) (lse − x_y) + ε (lse − Σ_w x_w / V) a row.

    logits (N, V) any float dtype; target (N,) int64 -> scalar float32.
    """
    V = logits.size(-1)
    lse, total, at = VocabTerms.apply(logits, target.unsqueeze(-1))  # (N,), (N,), (N, 1)
    real = (target != PAD_ID).float()  # (N,)
    nll = lse - at.squeeze(-1)  # (N,) −log p(y)
    smooth = lse - total / V  # (N,) −mean_w log p(w)
    return (((1.0 - label_smoothing) * nll + label_smoothing * smooth) * real).sum()
