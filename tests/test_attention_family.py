"""Local attention and multi-head attention inside the model: decoding step by step gives
teacher forcing's numbers (the target position travels with the decoder state), sentences
are independent of their batch, the fused training loop gives local attention the
step-by-step path's gradients, beam 1 is greedy, every new parameter learns, and beam
search's hypotheses sharing their sentence's encoding get the numbers of copies of it."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from test_model import SHAPES, STYLES, batch, make_model
from test_recurrence import FED_BACK, assert_fused_matches_step_by_step
from test_search import assert_beam_of_one_is_greedy, tiny_model

from nmt.attention import build_attention
from nmt.step import token_loss

FAMILY: dict[str, dict[str, Any]] = {
    "local_m": {"attention_scope": "local_m", "attention_window": 1},
    "local_p": {"attention_scope": "local_p", "attention_window": 1},
    "heads": {"attention_heads": 2},
    "local_p-heads": {"attention_scope": "local_p", "attention_window": 2, "attention_heads": 2},
}
COMBOS = [
    pytest.param({"attention": a, **FAMILY[f], **STYLES[s]}, id=f"{f}-{a}-{s}")
    for f, a, s in itertools.product(FAMILY, ["dot", "concat"], STYLES)
]


@pytest.mark.parametrize("keys", COMBOS)
def test_step_by_step_decoding_equals_teacher_forced_forward(keys: dict[str, Any]) -> None:
    model = make_model(**keys).eval()
    src, lens, tgt_in = batch(SHAPES)
    out = model(src, lens, tgt_in)
    enc = model.encode(src, lens)
    state = model.init_state(enc)
    for t in range(tgt_in.size(1)):
        logits, state, weights = model.step(tgt_in[:, t], state, enc)
        torch.testing.assert_close(logits, out.logits[:, t], atol=1e-5, rtol=0)
        torch.testing.assert_close(weights, out.attention[:, t], atol=1e-5, rtol=0)


@pytest.mark.parametrize("keys", COMBOS)
def test_sentence_alone_equals_sentence_padded_in_a_batch(keys: dict[str, Any]) -> None:
    model = make_model(**keys).eval()
    src, lens, tgt_in = batch(SHAPES)
    out = model(src, lens, tgt_in, heads=True)
    alone = model(src[1:2, :4], lens[1:2], tgt_in[1:2, :3], heads=True)
    torch.testing.assert_close(out.logits[1:2, :3], alone.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.attention[1:2, :3, :4], alone.attention, atol=1e-5, rtol=0)
    assert out.heads is not None and alone.heads is not None
    torch.testing.assert_close(out.heads[1:2, :, :3, :4], alone.heads, atol=1e-5, rtol=0)
    assert (out.attention[1, :, 4:] == 0).all()
    torch.testing.assert_close(out.heads.mean(1), out.attention)


LOCAL_FUSED = [
    pytest.param(
        {"attention": a, "attention_scope": k, "attention_window": 1, **FED_BACK[s]},
        id=f"{k}-{a}-{s}",
    )
    for k, a, s in itertools.product(
        ["local_m", "local_p"], ["dot", "scaled_dot", "bilinear", "concat"], FED_BACK
    )
] + [
    pytest.param(
        {"attention": "concat", "attention_scope": k, "copy": True, **FED_BACK["bahdanau"]},
        id=f"{k}-concat-bahdanau-copy",
    )
    for k in ("local_m", "local_p")
]


@pytest.mark.parametrize("keys", LOCAL_FUSED)
def test_the_fused_loop_gives_local_attention_the_step_by_step_numbers(
    keys: dict[str, Any],
) -> None:
    assert_fused_matches_step_by_step(make_model(**keys, dropout=0.0).train())


@pytest.mark.parametrize("copy", [False, True], ids=["", "copy"])
@pytest.mark.parametrize("family", FAMILY)
@pytest.mark.parametrize("decoder, feed", [("bahdanau", False), ("luong", True)])
def test_beam_of_one_equals_greedy(family: str, decoder: str, feed: bool, copy: bool) -> None:
    keys = {**FAMILY[family], "attention_window": 2}
    assert_beam_of_one_is_greedy(tiny_model("bilinear", decoder, feed, copy=copy, **keys))


@pytest.mark.parametrize("keys", COMBOS)
def test_gradients_reach_every_parameter(keys: dict[str, Any]) -> None:
    model = make_model(**keys).train()
    src, lens, tgt_in = batch(SHAPES)
    out = model(src, lens, tgt_in)
    token_loss(out, torch.roll(tgt_in, -1, dims=1), 0.1).backward()
    silent = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.any()]
    assert silent == []


SHARED = [
    pytest.param({"attention": a, **scope, **STYLES[s]}, id=f"{f}-{a}-{s}")
    for (f, scope), a, s in itertools.product(
        [("global", {}), *FAMILY.items()], ["dot", "concat"], STYLES
    )
] + [
    pytest.param({"attention": a, "copy": True, **STYLES[s]}, id=f"copy-{a}-{s}")
    for a, s in itertools.product(["scaled_dot", "bilinear"], ["bahdanau", "luong_feeding"])
]


@pytest.mark.parametrize("keys", SHARED)
def test_hypotheses_sharing_their_sentence_encoding_get_the_numbers_of_copies_of_it(
    keys: dict[str, Any],
) -> None:
    """Beam search's K rows a sentence read one encoding (`Encoded.beams`): every step's
    log-probabilities, attention and state equal those from K copies of it (the rows of a
    sentence differ, the target position is past 0 for local windows, and after sentences
    leave `select` still picks sentences)."""
    model = make_model(**keys).eval()
    src, lens, _ = batch(SHAPES)
    K, B = 3, len(SHAPES)
    gen = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        enc = model.encode(src, lens)
        expand = torch.arange(B).repeat_interleave(K)
        state = model.init_state(enc).select(expand)
        state.hidden = torch.randn(state.hidden.shape, generator=gen)  # rows of a sentence differ
        copies, shared = enc.select(expand), enc.beams(K)
        for t in range(4):
            if t == 2:  # the first sentence leaves: its K rows go
                rows = torch.arange(K, B * K)
                copies, shared = copies.select(rows), shared.select(torch.arange(1, B))
                state = state.select(rows)
            prev = torch.randint(4, model.tgt_vocab_size, (state.hidden.size(1),), generator=gen)
            want_logits, want_state, want_attn = model.step(prev, state, copies)
            logits, got_state, attn = model.step(prev, state, shared)
            torch.testing.assert_close(logits, want_logits, atol=1e-5, rtol=0)
            torch.testing.assert_close(attn, want_attn, atol=1e-6, rtol=0)
            torch.testing.assert_close(got_state.hidden, want_state.hidden, atol=1e-6, rtol=0)
            assert got_state.t == want_state.t == t + 1
            state = got_state


@pytest.mark.parametrize("scope", ["global", "local_m", "local_p"])
@pytest.mark.parametrize("heads", [1, 2])
def test_grouped_queries_give_each_head_the_weights_of_copies(scope: str, heads: int) -> None:
    """`Attention.forward(group=G)` with heads=True: each query row's (H, S) weights."""
    torch.manual_seed(0)
    att = build_attention(
        "concat", query_size=6, key_size=6, hidden_size=4, scope=scope, window=1, heads=heads
    ).eval()
    keys, G = torch.randn(2, 5, 6), 3
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    query, copies = torch.randn(2 * G, 6), torch.arange(2).repeat_interleave(G)
    proj = att.project_keys(keys)
    want = att(query, proj[copies], keys[copies], mask[copies], first=2, heads=True)
    got = att(query, proj, keys, mask, first=2, heads=True, group=G)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=0)
