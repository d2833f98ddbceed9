"""Luong et al. 2015's local attention (§3.2): each target step looks at a window of 2D + 1
source positions around an aligned position p_t, not at the whole sentence.

- `local_m` (monotonic): p_t = t, the target position, clipped to the sentence's last
  position (its real length, not the padded one);
- `local_p` (predictive): p_t = (L − 1) · σ(v_pᵀ tanh(W_p h_t)), with L the sentence's real
  length, and the scores inside the window favour positions near p_t by a Gaussian of
  σ = D/2: score(s) − (s − p_t)² / 2σ².

The paper multiplies the window's softmax by exp(−(s − p_t)² / 2σ²), so its weights sum to
less than one; adding the log of that factor to the scores is the same product renormalised
over the window. nmt renormalises: the context stays an average of source states whatever
p_t is, copy attention still gets a distribution over the source, and the entropy and
alignment figures of the attention study compare like with like across scopes. The gradient
reaches W_p and v_p through the Gaussian term, as in the paper; the window's edge is a mask
(it has none).

The window is one mask over the scores of every step and sentence at once (no Python loop
over sentences or steps). Position p_t is in [0, L − 1], so each window holds at least one
real position and a row of weights is never empty.

Shape legend: B batch, T target steps (the queries), S source length, Dq query size.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from nmt import onednn, vml

SCOPES = ("global", "local_m", "local_p")


def centres_monotonic(lengths: Tensor, first: int, steps: int) -> Tensor:
    """local-m's p_t = t, clipped to the sentence: lengths (B,) -> (B, T) float32 for the
    target positions first .. first + steps − 1."""
    t = torch.arange(first, first + steps, device=lengths.device, dtype=torch.float32)  # (T,)
    last = (lengths - 1).clamp(min=0).float()  # (B,)
    return torch.minimum(t.unsqueeze(0), last.unsqueeze(1))  # (B, T)


def window_mask(centres: Tensor, mask: Tensor, width: int) -> tuple[Tensor, Tensor]:
    """Positions within `width` of each centre and real: centres (B, T) float32, mask (B, S)
    bool -> window (B, T, S) bool, offsets s − p_t (B, T, S) float32."""
    s = torch.arange(mask.size(1), device=mask.device, dtype=torch.float32)  # (S,)
    offsets = s.view(1, 1, -1) - centres.unsqueeze(-1)  # (B, T, S)
    window = (offsets.abs() <= width) & mask.unsqueeze(1)  # (B, T, S)
    return window, offsets


class LocalScope(nn.Module):
    """Where each step may look: a window of `width` (Luong's D) positions either side of
    p_t. `local_p` owns the position predictor's W_p (Dq -> Dq) and v_p (Dq -> 1)."""

    def __init__(self, kind: str, *, width: int, query_size: int) -> None:
        super().__init__()
        if kind not in SCOPES[1:]:
            raise ValueError(
                f"model.attention_scope: unknown local scope {kind!r}; "
                f"expected one of {', '.join(SCOPES[1:])}"
            )
        self.kind, self.width = kind, width
        self.sigma = width / 2  # the paper's σ = D/2
        predictive = kind == "local_p"
        self.w_p = nn.Linear(query_size, query_size, bias=False) if predictive else None
        self.v_p = nn.Linear(query_size, 1, bias=False) if predictive else None

    def centres(
        self, query: Tensor, lengths: Tensor, first: int, same_step: bool = False
    ) -> Tensor:
        """p_t for each query: query (B, T, Dq), lengths (B,) -> (B, T) float32; local-m's
        (B, 1) where the T queries are all at position `first` (same_step)."""
        if self.w_p is None or self.v_p is None:
            return centres_monotonic(lengths, first, 1 if same_step else query.size(1))
        u = vml.tanh(onednn.layer(self.w_p, query))  # (B, T, Dq)
        share = torch.sigmoid(self.v_p(u)).squeeze(-1)  # (B, T)
        return share.float() * (lengths - 1).clamp(min=0).float().unsqueeze(1)  # (B, T)

    def forward(
        self, query: Tensor, mask: Tensor, first: int, same_step: bool = False
    ) -> tuple[Tensor | None, Tensor]:
        """query (B, T, Dq), mask (B, S) bool -> what `Attention.scoped` adds to the scores
        ((B, T, S) float32, local-p's Gaussian term; None for local-m) and the window
        (B, T, S) bool ((B, 1, S) for local-m's same_step: see `centres`)."""
        lengths = mask.sum(-1)  # (B,) real lengths, from the mask: no host sync
        centres = self.centres(query, lengths, first, same_step)  # (B, T|1)
        window, offsets = window_mask(centres, mask, self.width)
        if self.kind == "local_m":
            return None, window
        return -(offsets**2) / (2 * self.sigma**2), window  # (B, T, S)
