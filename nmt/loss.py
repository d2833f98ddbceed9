"""The training losses' vocabulary terms. `cross_entropy` is the plain model's loss, label
smoothing included (PyTorch's own); `VocabTerms` is what `nmt.copy.copy_loss` reads of the
(N, V) logits for the copy mixture, with one (N, V) gradient backward.

Why PyTorch's for the plain loss: until session 16 this module fused it by hand, which was
2× faster than `F.cross_entropy` at 8,000 pieces; that gain came from allocating fewer
fresh (N, V) blocks, each of which glibc took from the kernel page by page. With freed
memory kept (`nmt.runtime.keep_freed_memory`), `F.cross_entropy` is the faster
(`scripts/bench_loss.py`: 9.8 against 14.2 ms in bf16, 7.6 against 11.8 in fp32, 1,280 ×
8,000).

Shape legend: N rows (target tokens, padding included), V vocabulary, K ids read a row.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.tokenizer import PAD_ID


class VocabTerms(torch.autograd.Function):
    """What a loss reads of the vocabulary logits (N, V), in float32: their logsumexp (N,),
    their sum (N,) and their values at K ids a row (N, K).

    Why a Function: autograd through a log-softmax, a sum and two gathers writes four (N, V)
    gradients and adds them up. This one keeps the float32 log-softmax of the forward (one
    fused pass, read straight from bf16 logits) and turns it into the one gradient in place:
    softmax · g_lse + g_total, then the K ids' terms added.
    """

    @staticmethod
    def forward(ctx: Any, logits: Tensor, ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        log_p = torch.log_softmax(logits, -1, dtype=torch.float32)  # (N, V)
        at = logits.gather(-1, ids).float()  # (N, K)
        lse = at[:, 0] - log_p.gather(-1, ids[:, :1]).squeeze(-1)  # (N,) x_k − log p_k
        ctx.save_for_backward(log_p, ids)
        ctx.dtype = logits.dtype
        return lse, logits.sum(-1, dtype=torch.float32), at  # (N,), (N,), (N, K)

    @staticmethod
    def backward(ctx: Any, g_lse: Tensor, g_total: Tensor, g_at: Tensor) -> tuple[Tensor, None]:
        log_p, ids = ctx.saved_tensors
        grad = log_p.exp_()  # (N, V) softmax, in the saved tensor's memory (used once)
        grad.mul_(g_lse.unsqueeze(-1)).add_(g_total.unsqueeze(-1))
        grad.scatter_add_(-1, ids, g_at)
        return grad.to(ctx.dtype), None


def cross_entropy(logits: Tensor, target: Tensor, label_smoothing: float) -> Tensor:
    """Summed cross entropy with label smoothing over the non-pad targets, in float32:
    (1 − ε) (lse − x_y) + ε (lse − Σ_w x_w / V) a row.

    logits (N, V) any float dtype; target (N,) int64 -> scalar float32.
    """
    return F.cross_entropy(
        logits.float(), target, ignore_index=PAD_ID, label_smoothing=label_smoothing,
        reduction="sum",
    )  # fmt: skip
