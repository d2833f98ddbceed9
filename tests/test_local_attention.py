"""Luong's local attention (nmt.local_attention): the window at sentence edges and under
padding, local-m's clipped position, and local-p's predicted position learning a monotone
alignment."""

from __future__ import annotations

import pytest
import torch

from nmt.attention import build_attention
from nmt.local_attention import LocalScope, centres_monotonic, window_mask


def test_local_m_centres_follow_the_target_position_and_stop_at_each_sentence_end() -> None:
    lengths = torch.tensor([5, 2, 1])
    got = centres_monotonic(lengths, first=0, steps=4)
    want = torch.tensor([[0, 1, 2, 3], [0, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.float32)
    torch.testing.assert_close(got, want)
    # one step at a time (decoding) gives the same rows as all steps at once (training)
    for t in range(4):
        torch.testing.assert_close(centres_monotonic(lengths, first=t, steps=1)[:, 0], want[:, t])


def test_the_window_is_cut_at_both_sentence_edges_and_never_covers_padding() -> None:
    mask = torch.tensor([[True] * 8, [True] * 3 + [False] * 5])  # lengths 8 and 3
    centres = torch.tensor([[0.0, 7.0, 3.5], [0.0, 2.0, 1.0]])
    window, offsets = window_mask(centres, mask, width=2)
    assert window.shape == offsets.shape == (2, 3, 8)
    assert window[0, 0].tolist() == [True, True, True] + [False] * 5  # start: 0..2
    assert window[0, 1].tolist() == [False] * 5 + [True, True, True]  # end: 5..7
    assert window[0, 2].tolist() == [False] * 2 + [True] * 4 + [False] * 2  # |s - 3.5| <= 2
    assert window[1, 1].tolist() == [True, True, True] + [False] * 5  # 0..4, cut at length 3
    assert not window[1, :, 3:].any()  # padding is never in a window
    assert offsets[0, 2, 0] == -3.5


@pytest.mark.parametrize("kind", ["local_m", "local_p"])
@pytest.mark.parametrize("scorer", ["dot", "bilinear", "concat"])
def test_local_weights_are_zero_outside_the_window_and_sum_to_one_inside(
    kind: str, scorer: str
) -> None:
    torch.manual_seed(0)
    att = build_attention(scorer, query_size=6, key_size=6, hidden_size=5, scope=kind, window=1)
    keys = torch.randn(2, 7, 6)
    mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    query = torch.randn(2, 5, 6)  # five target steps at once
    _, weights = att(query, att.project_keys(keys), keys, mask)
    assert att.scope is not None
    centres = att.scope.centres(query, mask.sum(-1), 0)  # (2, 5)
    window, _ = window_mask(centres, mask, width=1)
    assert (weights[~window] == 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 5))
    # the one-step call at position t gives row t of the all-steps call
    for t in range(5):
        _, one = att(query[:, t], att.project_keys(keys), keys, mask, first=t)
        torch.testing.assert_close(one, weights[:, t])


def test_local_p_predicts_positions_that_follow_a_monotone_alignment() -> None:
    """Keys that carry no information (all zero): only the predicted position can put the
    weight on the aligned source position, so the loss is met only if p_t learns the
    alignment s*(t) = t · (L − 1) / (T − 1) from a query that says where t is."""
    torch.manual_seed(0)
    steps, length = 9, 13
    scope = LocalScope("local_p", width=4, query_size=6)
    att = build_attention("dot", query_size=6, key_size=6, hidden_size=None)
    att.scope = scope
    r = torch.linspace(0, 1, steps)  # relative target position
    query = torch.stack([r, 1 - r, r**2, (1 - r) ** 2, torch.ones(steps), r**3], -1)[None]
    keys = torch.zeros(1, length, 6)
    mask = torch.ones(1, length, dtype=torch.bool)
    aligned = torch.round(r * (length - 1)).long()  # (T,) s*(t)
    opt = torch.optim.Adam(att.parameters(), lr=0.05)
    for _ in range(300):
        _, weights = att(query, att.project_keys(keys), keys, mask)  # (1, T, S)
        loss = -weights[0, torch.arange(steps), aligned].clamp(min=1e-9).log().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    centres = scope.centres(query, mask.sum(-1), 0)[0].detach()
    assert (centres - aligned.float()).abs().max() < 1.0, centres
    assert bool((centres[1:] > centres[:-1]).all())  # monotone, as the alignment


def test_an_unknown_scope_is_refused_with_its_key() -> None:
    with pytest.raises(ValueError, match="model.attention_scope"):
        LocalScope("local_x", width=3, query_size=4)
