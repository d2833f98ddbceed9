"""Attention scoring functions: small stateless modules sharing one call signature.

Every scorer splits its work in two so that nothing about the source is recomputed per
decoder step:

- `project_keys(keys)` runs once per sentence on the encoder states (B, S, Dk) and returns
  what the scorer compares queries against (B, S, Dp);
- `forward(query, proj_keys, values, mask)` scores one step (query (B, Dq)) or all steps at
  once (query (B, T, Dq), one batched matrix product: the fast path for decoders whose
  queries do not depend on earlier attention).

The modules keep no state between calls (Joey NMT stores `proj_keys` on the module, which
breaks as soon as two batches are in flight, e.g. in beam search). Scores go through
`masked_softmax`, which is safe under fp16/bf16 autocast.

Shape legend: B batch, T target steps, S source length, Dq query size, Dk key (= encoder
state) size, Dv value size, Dp projected key size, A the concat scorer's hidden size.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from nmt import onednn, vml
from nmt.local_attention import LocalScope


def masked_softmax(scores: Tensor, mask: Tensor) -> Tensor:
    """Softmax over the last dim of `scores` that gives exactly zero weight where `mask` is False.

    `mask` is bool, True = real position, broadcastable to `scores`. The softmax runs in
    float32 whatever the input dtype: masking with `-1e9` overflows fp16, and fp16/bf16
    softmax loses precision. Masked scores are set to float32's minimum rather than `-inf`,
    so a row with no real position gives zeros, not NaN. Returns float32 weights.
    """
    scores = scores.float().masked_fill(~mask, torch.finfo(torch.float32).min)
    # exp(min - max) underflows to 0 for masked positions in any row that has a real one;
    # the masked_fill makes it exact for rows that have none (uniform over pads otherwise).
    return scores.softmax(dim=-1).masked_fill(~mask, 0.0)


def additive_hidden(
    q: Tensor, keys: Tensor, out: Tensor | None = None, *, decoding: bool = False
) -> tuple[Tensor, bool]:
    """The additive (concat) scorer's hidden layer for every query/key pair: tanh(q + k), with
    q and keys already broadcast against each other (..., T, 1, A) and (..., 1, S, A);
    written into `out` (float32, their broadcast shape) where given.

    In float32 it returns σ(2q + 2k) and True instead: tanh(x) = 2σ(2x) − 1 exactly, and
    ATen's float32 tanh is MKL's slow path on AMD's CPUs (`nmt.vml`, whose `tanh` gives the
    other float32 tanh calls the same form): 3.5× slower than ATen's own sigmoid on an AVX2
    EPYC (5.6M values: 9.5 against 2.6 ms on 2 cores), while this tensor is the largest a
    decoding step makes ((beam·B, S, A): 44 % of a beam-5 step of the reference model). The
    caller turns scores of σ back into scores of tanh with `from_sigmoid`: vᵀ(2σ − 1) =
    2 vᵀσ − Σv. In half precision the sigmoid form is 4× less accurate around 0 (σ ≈ 0.5 has
    bf16's coarsest steps), so fp16/bf16 keep tanh (False); so does `decoding` (no
    gradients) where MKL runs its fast path (`nmt.vml.TANH_FAST`)."""
    if q.dtype != torch.float32 or keys.dtype != torch.float32 or (decoding and vml.TANH_FAST):
        return torch.add(q, keys, out=out).tanh_(), False
    # alpha=2 doubles the keys inside the add's own pass; the sigmoid runs in place on it
    return torch.add(q * 2, keys, alpha=2, out=out).sigmoid_(), True


def from_sigmoid(scores: Tensor, v_sum: Tensor) -> Tensor:
    """Scores vᵀσ(2x) -> vᵀtanh(x) = 2 vᵀσ(2x) − Σv (`additive_hidden`); v_sum broadcasts."""
    return scores * 2 - v_sum


def weighted_sum(weights: Tensor, values: Tensor, group: int = 1) -> Tensor:
    """The context: weights (B, [T,] S) over values (B, S, Dv) -> (B, [T,] Dv), in the
    values' dtype (float32 weights are cast for the product). group: weights (B·G, S) are
    G rows a sentence of values (B, S, Dv) (`Attention.forward`) -> (B·G, Dv)."""
    if weights.dim() == 2 and group > 1:  # as (B, G, S): G steps' weights, then a row each
        return weighted_sum(weights.reshape(values.size(0), group, -1), values).flatten(0, 1)
    if weights.dim() == 2:
        return torch.bmm(weights.unsqueeze(1).to(values.dtype), values).squeeze(1)  # (B, Dv)
    return torch.bmm(weights.to(values.dtype), values)  # (B, T, Dv)


class Attention(nn.Module):
    """Base class of the scorers: turns scores into weights and a context vector.

    `scope` is where on the source each step may look: None is global attention (every
    position); a `nmt.local_attention.LocalScope` is Luong's local attention, a window around
    a position per step, set by `build_attention`."""

    scope: LocalScope | None

    def __init__(self) -> None:
        super().__init__()
        self.scope = None

    def project_keys(self, keys: Tensor) -> Tensor:
        """Prepare encoder states for scoring, once per sentence: (B, S, Dk) -> (B, S, Dp)."""
        return keys

    def score(self, query: Tensor, proj_keys: Tensor) -> Tensor:
        """Unnormalised scores. query (B, T, Dq), proj_keys (B, S, Dp) -> (B, T, S), or
        (B, H, T, S) for H heads."""
        raise NotImplementedError(f"{type(self).__name__} must define score()")

    def forward(
        self,
        query: Tensor,
        proj_keys: Tensor,
        values: Tensor,
        mask: Tensor,
        first: int = 0,
        heads: bool = False,
        group: int = 1,
    ) -> tuple[Tensor, Tensor]:
        """Attend from one step or all steps to the source.

        query: (B, Dq) for one decoder step, or (B, T, Dq) for T steps in one batched product.
        proj_keys: (B, S, Dp) from `project_keys`. values: (B, S, Dv) encoder states.
        mask: (B, S) bool, True = real source token. first: the target position of the first
        query (local attention's windows follow it; global attention ignores it).
        Returns context (B, [T,] Dv) in the values' dtype and float32 weights (B, [T,] S)
        that are exactly zero on padding (and outside a local window) and sum to 1 over the
        rest. heads=True: the weights of each head, (B, H, [T,] S) (here H = 1).

        group: for one step, the query's rows are `group` consecutive hypotheses of each of
        the B sentences the keys, values and mask hold (beam search, `Encoded.beams`): query
        (B·G, Dq) is scored as G queries a sentence at position `first`, and the results come
        back one row per query, (B·G, Dv) and (B·G, [H,] S).
        """
        one_step = query.dim() == 2
        grouped = one_step and group > 1  # G queries a sentence, all at position `first`
        if grouped:
            query = query.reshape(mask.size(0), group, -1)  # (B, G, Dq)
        elif one_step:
            query = query.unsqueeze(1)  # (B, 1, Dq)
        scores = self.score(query, proj_keys)  # (B, [H,] T, S)
        # mask broadcasts to scores; local-m's window is the step's for a group's queries
        scores, allowed = self.scoped(scores, query, mask, first, same_step=grouped)
        weights = masked_softmax(scores, allowed)  # (B, [H,] T, S) float32
        context = self.context(weights, proj_keys, values)  # (B, T, Dv)
        if weights.dim() == 4 and not heads:
            weights = weights.mean(1)  # (B, T, S) the heads' mean
        elif weights.dim() == 3 and heads:
            weights = weights.unsqueeze(1)  # (B, 1, T, S) one head
        if grouped:  # one row per query: (B·G, Dv), (B·G, [H,] S)
            per_query = weights.transpose(1, 2) if heads else weights  # (B, G, [H,] S)
            return context.flatten(0, 1), per_query.flatten(0, 1)
        if one_step:
            return context.squeeze(1), weights.squeeze(-2)  # (B, Dv), (B, [H,] S)
        return context, weights

    def context(self, weights: Tensor, proj_keys: Tensor, values: Tensor) -> Tensor:
        """The weighted average of the values: weights (B, T, S) -> (B, T, Dv)."""
        return weighted_sum(weights, values)

    def scoped(
        self, scores: Tensor, query: Tensor, mask: Tensor, first: int, same_step: bool = False
    ) -> tuple[Tensor, Tensor]:
        """The scores and where they may go, under the scope: scores (B, [H,] T, S), query
        (B, T, Dq), mask (B, S) -> the scores plus local-p's Gaussian term, and a bool mask
        that broadcasts to them, True on real positions (inside the window, for a local
        scope). Heads share one window. same_step: the T queries are all at position
        `first` (hypotheses of one step), not at first, first + 1, ..."""
        if self.scope is None:
            allowed = mask.unsqueeze(1)  # (B, 1, S)
            return scores, allowed if scores.dim() == 3 else allowed.unsqueeze(1)  # (B, 1, 1, S)
        bias, window = self.scope(query, mask, first, same_step)  # (B, T|1, S) float32|None, bool
        if scores.dim() == 4:  # heads share the window: (B, 1, T, S)
            bias = None if bias is None else bias.unsqueeze(1)
            window = window.unsqueeze(1)
        return (scores if bias is None else scores.float() + bias), window


class DotAttention(Attention):
    """Luong's `dot`: score = s · h.

    When the query size differs from the key size the dot product is undefined, so the keys
    are mapped to the query size by a bias-free Linear (Dk -> Dq), once per sentence in
    `project_keys`. When the sizes match there is no parameter at all.
    """

    def __init__(self, *, query_size: int, key_size: int) -> None:
        super().__init__()
        self.query_size = query_size
        self.key_proj = (
            nn.Linear(key_size, query_size, bias=False) if key_size != query_size else None
        )

    def project_keys(self, keys: Tensor) -> Tensor:
        return keys if self.key_proj is None else onednn.layer(self.key_proj, keys)  # (B, S, Dq)

    def score(self, query: Tensor, proj_keys: Tensor) -> Tensor:
        return torch.bmm(query, proj_keys.transpose(1, 2))  # (B, T, S)


class ScaledDotAttention(DotAttention):
    """Vaswani's `scaled_dot`: score = s · h / √Dq.

    Dot products of d-dimensional vectors grow like √d, which saturates the softmax for large
    states (Britz et al. 2017); dividing by √Dq keeps the scores' scale independent of size.
    Keys are projected like `DotAttention`'s when sizes differ.
    """

    def __init__(self, *, query_size: int, key_size: int) -> None:
        super().__init__(query_size=query_size, key_size=key_size)
        self.scale = 1.0 / math.sqrt(query_size)

    def score(self, query: Tensor, proj_keys: Tensor) -> Tensor:
        return super().score(query, proj_keys) * self.scale  # (B, T, S)


class BilinearAttention(Attention):
    """Luong's `general`: score = s W hᵀ, computed as s · (W h) with W h once per sentence."""

    def __init__(self, *, query_size: int, key_size: int) -> None:
        super().__init__()
        self.key_proj = nn.Linear(key_size, query_size, bias=False)

    def project_keys(self, keys: Tensor) -> Tensor:
        return onednn.layer(self.key_proj, keys)  # (B, S, Dq)

    def score(self, query: Tensor, proj_keys: Tensor) -> Tensor:
        return torch.bmm(query, proj_keys.transpose(1, 2))  # (B, T, S)


# Decoding's concat hidden layer, where it holds more than CHUNKED_ABOVE values, is computed
# in chunks of about CHUNK_VALUES (512 KB of float32, within a core's L2 cache) by
# `chunked_scores`. Beam 5 (320 rows) is chunked, greedy's 64 rows mostly not: near the
# cache's size, they would only gain operators (test_2016_flickr, two workers: session 29,
# greedy bf16 4 % slower chunked at every step; session 32, int8, 10 alternated pairs, 3
# faster, medians 0.769 → 0.791 s).
CHUNK_VALUES = 1 << 17
CHUNKED_ABOVE = 8 * CHUNK_VALUES


class ConcatAttention(Attention):
    """Bahdanau's additive attention (OpenNMT's `mlp`): score = vᵀ tanh(W [s; h]).

    W [s; h] is split as W_q s + W_k h: W_k h depends only on the source and is computed once
    per sentence in `project_keys`; each step adds W_q s (which carries the only bias).
    """

    def __init__(self, *, query_size: int, key_size: int, hidden_size: int) -> None:
        super().__init__()
        self.key_proj = nn.Linear(key_size, hidden_size, bias=False)
        self.query_proj = nn.Linear(query_size, hidden_size)
        self.v = nn.Linear(hidden_size, 1, bias=False)

    def project_keys(self, keys: Tensor) -> Tensor:
        return onednn.layer(self.key_proj, keys)  # (B, S, A)

    def score(self, query: Tensor, proj_keys: Tensor) -> Tensor:
        q = onednn.layer(self.query_proj, query)  # (B, T, A)
        scores, sigmoid = self._hidden_scores(q, proj_keys)  # (B, T, S)
        if not sigmoid:
            return scores
        v_sum = self.v.weight.sum()  # () float always: int8 keeps v (`nmt.int8.MIN_OUTPUTS`)
        return from_sigmoid(scores, v_sum)

    def _hidden_scores(self, q: Tensor, proj_keys: Tensor) -> tuple[Tensor, bool]:
        """q (B, T, A) projected queries, proj_keys (B, S, A) -> vᵀ of the hidden layer (B, T,
        S) and whether that layer is `additive_hidden`'s sigmoid form."""
        v = self.v.weight  # (1, A)
        decoding = not torch.is_grad_enabled() and q.device.type == "cpu"  # (not a GPU's)
        large = q.numel() * proj_keys.size(1) > CHUNKED_ABOVE  # B·T·S·A values
        one_dtype = q.dtype == proj_keys.dtype == v.dtype == torch.float32
        if decoding and large and one_dtype and proj_keys.size(0) == q.size(0):  # (not broadcast)
            return chunked_scores(q, proj_keys, v.view(-1))
        # Training keeps one tensor: the backward reads it.
        q, keys = q.unsqueeze(2), proj_keys.unsqueeze(1)  # (B, T, 1, A), (B, 1, S, A)
        hidden, sigmoid = additive_hidden(q, keys, decoding=decoding)  # (B, T, S, A)
        return self.v(hidden).squeeze(-1), sigmoid  # (B, T, S)


def chunked_scores(q: Tensor, keys: Tensor, v: Tensor) -> tuple[Tensor, bool]:
    """vᵀ of `additive_hidden`'s layer, a few sentences at a time: q (B, T, A), keys (B, S,
    A), v (A,), all float32 -> (B, T, S), and whether the layer was its sigmoid form.
    Decoding on a CPU, without gradients.

    Why: the hidden layer (B, T, S, A) is the largest tensor a decoding step makes (beam 5's
    64 × 5 × 20 × 512 values are 13 MB), far larger than a core's L2 cache (2 MB on a Xeon
    with AMX), so its write, the activation's pass and vᵀ's read each went out to the L3
    cache and back. Here each chunk of about CHUNK_VALUES values is written, passed through
    its activation in place (tanh or σ, `additive_hidden`) and read by vᵀ while it is in the
    L2 cache. Every chunk reuses one buffer, and vᵀ (one `mv`) writes straight into the
    chunk's rows of the scores: a fresh tensor a chunk (session 29's chunks) was fresh memory
    to fault in, and gathering the chunks' scores one more copy (beam 5, int8, two workers, 8
    alternated pairs: 6 faster, medians 2.442 → 2.364 s; session 32). The same arithmetic,
    row by row. On a GPU one pass over the whole layer is faster: `_hidden_scores` keeps it
    there.
    """
    B, T, A = q.shape
    S = keys.size(1)
    n = max(1, min(B, CHUNK_VALUES // (T * S * A)))  # sentences a chunk
    buffer = q.new_empty(n, T, S, A)
    scores = q.new_empty(B, T, S)
    sigmoid = True
    for i in range(0, B, n):
        hidden = buffer[: min(n, B - i)]  # (n', T, S, A)
        q_i, keys_i = q[i : i + n].unsqueeze(2), keys[i : i + n].unsqueeze(1)
        _, sigmoid = additive_hidden(q_i, keys_i, out=hidden, decoding=True)
        torch.mv(hidden.view(-1, A), v, out=scores[i : i + n].view(-1))  # (n'·T·S,)
    return scores, sigmoid


ATTENTIONS: dict[str, type[Attention]] = {
    "dot": DotAttention,
    "scaled_dot": ScaledDotAttention,
    "bilinear": BilinearAttention,
    "concat": ConcatAttention,
}


def build_attention(
    name: str,
    *,
    query_size: int,
    key_size: int,
    hidden_size: int | None,
    heads: int = 1,
    scope: str = "global",
    window: int = 10,
) -> Attention:
    """The scorer called `name`; `hidden_size` is concat's (None = query_size), unused by
    others. `heads` > 1: `nmt.multihead.MultiHeadAttention` of that scorer (1: the scorer
    itself, as before heads existed). `scope` local_m / local_p: a window of `window`
    positions either side (`nmt.local_attention`)."""
    if name not in ATTENTIONS:
        raise ValueError(
            f"model.attention: unknown scoring function {name!r}; "
            f"expected one of {', '.join(ATTENTIONS)}"
        )
    size = query_size if hidden_size is None else hidden_size
    attention: Attention
    if heads > 1:
        from nmt.multihead import MultiHeadAttention  # it builds on this module's Attention

        attention = MultiHeadAttention(
            name, heads=heads, query_size=query_size, key_size=key_size, hidden_size=size
        )
    else:
        attention = _one_head(name, query_size=query_size, key_size=key_size, hidden_size=size)
    if scope != "global":
        attention.scope = LocalScope(scope, width=window, query_size=query_size)
    return attention


def _one_head(name: str, *, query_size: int, key_size: int, hidden_size: int) -> Attention:
    cls = ATTENTIONS[name]
    if issubclass(cls, ConcatAttention):
        return cls(query_size=query_size, key_size=key_size, hidden_size=hidden_size)
    if issubclass(cls, (DotAttention, BilinearAttention)):
        return cls(query_size=query_size, key_size=key_size)
    raise TypeError(f"build_attention: no constructor rule for {cls.__name__}")
