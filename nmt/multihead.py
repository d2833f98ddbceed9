"""Multi-head attention over the encoder (Vaswani et al. 2017, §3.2.2), for each scorer.

H heads each score the source with their own projections, each takes its own weighted
average of (projected) source states, and the H contexts are concatenated and projected
back to the encoder's size, so the decoders see a context of the usual size. How each
scoring function generalises to heads:

- `dot`, `scaled_dot`: Vaswani's heads. q_h = W_q^h s, k_h = W_k^h h, both Dq/H wide;
  score = q_h · k_h (scaled by 1/√(Dq/H)).
- `bilinear` (Luong's general, s W h): W's Dq output rows split into H blocks. Head h scores
  the h-th slice of the query against its block: s_h · (W^h h). The parameters are today's W;
  what changes is one softmax per block.
- `concat` (Bahdanau's vᵀ tanh(W_q s + W_k h)): the A hidden units split into H groups, head h
  summing its group only: v_hᵀ tanh(W_q^h s + W_k^h h). Today's parameters again, one
  softmax per group.

Every head also projects the values: v_h = W_v^h h (Dv/H wide), and the context is
W_o [c_1; …; c_H]. Keys and values are projected once per sentence (`project_keys` returns
them side by side). The weights the decoder, copy attention and the alignment tools see are
the heads' mean (a distribution too); `heads=True` gives each head's. H = 1 is not built by
this module: `build_attention` keeps today's scorer, so existing checkpoints are unchanged.

Shape legend: B batch, H heads, T target steps, S source length, Dq query size, Dk key
(encoder state) size, Dv value size (= Dk), K the projected keys' width (Dq; concat: A),
A the concat scorer's hidden size.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from nmt import onednn
from nmt.attention import Attention, additive_hidden, from_sigmoid
from nmt.config import heads_problems


class MultiHeadAttention(Attention):
    """H heads of the scoring function `kind` (see the module's docstring)."""

    def __init__(
        self, kind: str, *, heads: int, query_size: int, key_size: int, hidden_size: int
    ) -> None:
        super().__init__()
        width = hidden_size if kind == "concat" else query_size  # K
        sizes = {"the query size": query_size, "the encoder state size": key_size, "K": width}
        problems = heads_problems(heads, sizes)
        if problems:
            raise ValueError(problems[0])
        self.kind, self.heads, self.key_width = kind, heads, width
        self.key_proj = nn.Linear(key_size, width, bias=False)  # W_k, all heads
        self.value_proj = nn.Linear(key_size, key_size, bias=False)  # W_v, all heads
        self.out_proj = nn.Linear(key_size, key_size, bias=False)  # W_o
        self.query_proj: nn.Linear | None = None
        self.v: nn.Parameter | None = None
        self.scale = 1.0
        if kind in ("dot", "scaled_dot"):
            self.query_proj = nn.Linear(query_size, query_size, bias=False)  # W_q
            if kind == "scaled_dot":
                self.scale = 1.0 / math.sqrt(query_size // heads)
        elif kind == "concat":
            self.query_proj = nn.Linear(query_size, width)  # W_q and the bias, all groups
            self.v = nn.Parameter(torch.empty(heads, width // heads))  # v_h per group
            bound = 1.0 / math.sqrt(width)  # nn.Linear(A, 1)'s own bound: the one-head v
            nn.init.uniform_(self.v, -bound, bound)
        elif kind != "bilinear":
            raise ValueError(f"model.attention: no multi-head form of {kind!r}")

    def project_keys(self, keys: Tensor) -> Tensor:
        """keys (B, S, Dk) -> [W_k h; W_v h] (B, S, K + Dv), once per sentence."""
        return torch.cat(
            [onednn.layer(self.key_proj, keys), onednn.layer(self.value_proj, keys)], dim=-1
        )

    def _split(self, x: Tensor) -> Tensor:
        """(B, N, H·d) -> (B, H, N, d)."""
        return x.view(x.size(0), x.size(1), self.heads, -1).transpose(1, 2)

    def score(self, query: Tensor, proj_keys: Tensor) -> Tensor:
        """query (B, T, Dq), proj_keys (B, S, K + Dv) -> scores (B, H, T, S)."""
        keys = self._split(proj_keys[..., : self.key_width])  # (B, H, S, K/H)
        q = query
        if self.query_proj is not None:
            q = onednn.layer(self.query_proj, query)  # (B, T, Dq or A)
        q = self._split(q)  # (B, H, T, Dq/H or A/H)
        if self.v is None:  # dot, scaled dot, bilinear
            scores = torch.matmul(q, keys.transpose(-1, -2))  # (B, H, T, S)
            return scores * self.scale if self.scale != 1.0 else scores
        hidden, sigmoid = additive_hidden(q.unsqueeze(3), keys.unsqueeze(2))  # (B, H, T, S, A/H)
        v = self.v.to(hidden.dtype)  # (H, A/H)
        scores = torch.einsum("bhtsa,ha->bhts", hidden, v)  # (B, H, T, S)
        return from_sigmoid(scores, v.sum(-1)[:, None, None]) if sigmoid else scores

    def context(self, weights: Tensor, proj_keys: Tensor, values: Tensor) -> Tensor:
        """Each head's average of its projected values, joined and projected: weights
        (B, H, T, S) -> (B, T, Dv); `values` is unused (the projected ones ride in
        `proj_keys`)."""
        vals = self._split(proj_keys[..., self.key_width :])  # (B, H, S, Dv/H)
        per_head = torch.matmul(weights.to(vals.dtype), vals)  # (B, H, T, Dv/H)
        return onednn.layer(self.out_proj, per_head.transpose(1, 2).flatten(2))  # (B, T, Dv)
