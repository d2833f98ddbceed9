"""Copy attention (pointer-generator): the decoder's attention becomes a distribution over the
source pieces, mixed with the vocabulary distribution by a learned gate.

    p(w) = g · P_vocab(w) + (1 − g) · Σ_{i: x_i = w} a_i,   g = σ(w_gᵀ [h̃_t; c_t; y_{t−1}] + b)

(Vinyals et al. 2015; Gu et al. 2016; See et al. 2017; OpenNMT-py's `copy_attn`). A name the
vocabulary spells with rare pieces ("▁Hel" "ga") loses to a common piece ("▁He") under
P_vocab alone even when the attention sits on the right source piece; the copy term makes
that attention itself a way to write the piece.

Source pieces are target ids through the joint vocabulary (`model.copy` requires
`tokenizer.joint: true`, checked at config time): every source piece is a target piece, so
no per-batch extended vocabulary is needed. A source piece the vocabulary does not know is
<unk> on both sides, and `nmt.translate` writes the source text it attends to in its place.

Everything is in float32 and in log space: log g and log(1 − g) are `logsigmoid(±z)`, the
two terms meet in `logaddexp`, and a word with no copy mass gets exactly log g + log P_vocab
(no log 0 in the graph: its gradient would be NaN).

The training loss never builds the (N, V) mixture: outside the source pieces log p(w) is
log g + log P_vocab(w), so the cross entropy and label smoothing's Σ_w log p(w) need only
the logits' logsumexp and sum (what plain cross entropy computes anyway) and their values at
the target and the S source pieces of each step, with one fused backward (`nmt.loss.VocabTerms`).

Shape legend: B batch, T target steps, S source length, V vocabulary, N rows (B·T or B),
D pre-output size, Dv context size, E embedding size.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from nmt.loss import VocabTerms
from nmt.tokenizer import PAD_ID

_TINY = 1e-30  # below any copy mass that matters; keeps log() and its gradient finite


class CopyGate(nn.Module):
    """z_t = w_gᵀ [h̃_t; c_t; y_{t−1}] + b: the logit of g, the probability of generating
    from the vocabulary (1 − g is the share copied from the source)."""

    def __init__(self, *, pre_size: int, context_size: int, emb_size: int) -> None:
        super().__init__()
        self.proj = nn.Linear(pre_size + context_size + emb_size, 1)

    def forward(self, pre: Tensor, context: Tensor, emb: Tensor) -> Tensor:
        """(N.., D), (N.., Dv), (N.., E) -> gate logits (N..,) float32."""
        return self.proj(torch.cat([pre, context, emb.to(pre.dtype)], dim=-1)).squeeze(-1).float()


def _safe_log(x: Tensor) -> Tensor:
    """log x, -inf where x == 0, with a zero (not NaN) gradient there."""
    return torch.where(x > 0, x.clamp_min(_TINY).log(), -torch.inf)


def mixture_log_probs(logits: Tensor, gate: Tensor, attention: Tensor, src: Tensor) -> Tensor:
    """The whole mixture's log-probabilities, float32: for decoding, one step at a time.

    logits (N, V) vocabulary logits; gate (N,) logits of g; attention (N, S) float32, zero on
    padding; src (N, S) source ids (target ids: joint vocabulary). Returns (N, V), each row
    summing to 1 in probability.
    """
    log_vocab = logits.float().log_softmax(-1) + nn.functional.logsigmoid(gate).unsqueeze(-1)
    copy = torch.zeros_like(log_vocab).scatter_add_(1, src, attention.float())  # (N, V)
    log_copy = nn.functional.logsigmoid(-gate).unsqueeze(-1) + _safe_log(copy)  # (N, V)
    return torch.logaddexp(log_vocab, log_copy)


def copy_loss(
    logits: Tensor,
    gate: Tensor,
    attention: Tensor,
    src: Tensor,
    target: Tensor,
    label_smoothing: float,
) -> Tensor:
    """Summed cross entropy of the mixture over the non-pad target tokens, float32: what
    `F.cross_entropy(log p, target, label_smoothing=ε)` gives, without building log p.

    logits (B, T, V), gate (B, T), attention (B, T, S) float32, src (B, S), target (B, T).
    Loss per token: (1 − ε) · (−log p(y)) + ε/V · (−Σ_w log p(w)).
    """
    B, T, V = logits.shape
    S = src.size(1)
    # log P_vocab at the target and at the source pieces, and Σ_w log P_vocab(w), from one
    # pass over the (B·T, V) logits with one fused backward (`nmt.loss.VocabTerms`).
    ids = torch.cat([target.unsqueeze(-1), src.unsqueeze(1).expand(B, T, S)], -1)  # (B, T, 1+S)
    lse, total, at = VocabTerms.apply(logits.reshape(B * T, V), ids.reshape(B * T, 1 + S))
    lse, total, at = lse.view(B, T), total.view(B, T), at.view(B, T, 1 + S)
    lsm_y = at[..., 0] - lse  # (B, T) log P_vocab(y)
    lsm_src = at[..., 1:] - lse.unsqueeze(-1)  # (B, T, S) log P_vocab(x_i)
    log_g = nn.functional.logsigmoid(gate)  # (B, T)
    log_1mg = nn.functional.logsigmoid(-gate)  # (B, T)
    attn = attention.float()
    # Copy mass of each source position's piece, all its occurrences together:
    # c_i = Σ_j a_j [x_j = x_i].
    same = src.unsqueeze(2) == src.unsqueeze(1)  # (B, S, S) [i, j]: x_i = x_j
    mass_at_src = torch.bmm(attn, same.to(attn.dtype))  # (B, T, S)
    src_t = src.unsqueeze(1).expand_as(attn)  # (B, T, S)
    gen_at_src = log_g.unsqueeze(-1) + lsm_src  # (B, T, S) log g P_vocab(x_i)
    mixed_at_src = torch.logaddexp(gen_at_src, log_1mg.unsqueeze(-1) + _safe_log(mass_at_src))

    # The target: log p(y) = logaddexp(log g P_vocab(y), log (1 − g) Σ_{i: x_i = y} a_i).
    is_y = (src_t == target.unsqueeze(-1)).to(attn.dtype)  # (B, T, S)
    mass_y = (attn * is_y).sum(-1)  # (B, T)
    gen_y = log_g + lsm_y  # (B, T)
    log_p_y = torch.logaddexp(gen_y, log_1mg + _safe_log(mass_y))  # (B, T)
    real = target != PAD_ID  # (B, T)
    loss = -(log_p_y * real).sum()
    if label_smoothing == 0.0:
        return loss

    # Σ_w log p(w) = V log g + Σ_w log P_vocab(w) + Σ over the distinct source pieces of
    # (mixed − generated): each piece counted once, at its first real position.
    first = _first_occurrence(src, same)  # (B, S)
    correction = ((mixed_at_src - gen_at_src) * first.unsqueeze(1)).sum(-1)  # (B, T)
    sum_log_p = V * log_g + (total - V * lse) + correction  # (B, T): Σ lsm = Σ logits − V lse
    smooth = -(sum_log_p * real).sum() / V
    return (1.0 - label_smoothing) * loss + label_smoothing * smooth


def _first_occurrence(src: Tensor, same: Tensor) -> Tensor:
    """(B, S) ids and their (B, S, S) equalities -> (B, S) float: 1 at the first position of
    each distinct real piece."""
    S = src.size(1)
    earlier = torch.ones(S, S, dtype=torch.bool, device=src.device).tril(-1)  # j < i
    seen_before = (same & earlier).any(-1)  # (B, S)
    return ((~seen_before) & (src != PAD_ID)).float()
