"""Tests for nmt.attention: masking, the four scorers' formulas, shapes and mixed precision."""

from __future__ import annotations

import math

import pytest
import torch

from nmt import attention, vml
from nmt.attention import (
    ATTENTIONS,
    Attention,
    BilinearAttention,
    ConcatAttention,
    DotAttention,
    additive_hidden,
    build_attention,
    masked_softmax,
)

B, T, S, DQ, DK = 3, 4, 6, 10, 12
LENS = torch.tensor([6, 2, 4])


def source_mask() -> torch.Tensor:
    return torch.arange(S).unsqueeze(0) < LENS.unsqueeze(1)  # (B, S)


def inputs(dq: int = DQ, dk: int = DK) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries for T steps (B, T, Dq), keys = values (B, S, Dk), mask (B, S)."""
    gen = torch.Generator().manual_seed(0)
    return torch.randn(B, T, dq, generator=gen), torch.randn(B, S, dk, generator=gen), source_mask()


def scorer(name: str, dq: int = DQ, dk: int = DK) -> Attention:
    torch.manual_seed(0)
    return build_attention(name, query_size=dq, key_size=dk, hidden_size=7)


# --------------------------------------------------------------------------- masked_softmax


def test_masked_softmax_zero_on_pads_and_rows_sum_to_one() -> None:
    scores = torch.randn(B, T, S) * 10
    weights = masked_softmax(scores, source_mask().unsqueeze(1))
    assert weights.dtype == torch.float32
    pads = ~source_mask().unsqueeze(1).expand(B, T, S)
    assert (weights[pads] == 0).all()
    assert torch.allclose(weights.sum(-1), torch.ones(B, T))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_masked_softmax_half_precision_no_nan_or_inf(dtype: torch.dtype) -> None:
    # Scores at the edge of fp16's range: `-1e9` masking or an fp16 softmax would break here.
    scores = torch.tensor([[60000.0, -60000.0, 1.0, 0.0]]).to(dtype)
    mask = torch.tensor([[True, True, True, False]])
    weights = masked_softmax(scores, mask)
    assert torch.isfinite(weights).all()
    assert weights[0, 3] == 0
    assert torch.allclose(weights.sum(-1), torch.ones(1))


def test_masked_softmax_fully_masked_row_gives_zeros_not_nan() -> None:
    weights = masked_softmax(torch.randn(2, 3).half(), torch.tensor([[False] * 3, [True] * 3]))
    assert torch.isfinite(weights).all()
    assert (weights[0] == 0).all()
    assert torch.allclose(weights[1].sum(), torch.tensor(1.0))


# --------------------------------------------------------------------------- scorers


@pytest.mark.parametrize("name", list(ATTENTIONS))
def test_shapes_for_one_step_and_all_steps(name: str) -> None:
    query, keys, mask = inputs()
    att = scorer(name)
    proj = att.project_keys(keys)
    context, weights = att(query, proj, keys, mask)
    assert context.shape == (B, T, DK) and weights.shape == (B, T, S)
    context1, weights1 = att(query[:, 0], proj, keys, mask)
    assert context1.shape == (B, DK) and weights1.shape == (B, S)


@pytest.mark.parametrize("name", list(ATTENTIONS))
def test_all_steps_at_once_equals_one_step_at_a_time(name: str) -> None:
    query, keys, mask = inputs()
    att = scorer(name)
    proj = att.project_keys(keys)
    context, weights = att(query, proj, keys, mask)
    for t in range(T):
        context_t, weights_t = att(query[:, t], proj, keys, mask)
        torch.testing.assert_close(context[:, t], context_t)
        torch.testing.assert_close(weights[:, t], weights_t)


@pytest.mark.parametrize("name", list(ATTENTIONS))
def test_pads_get_zero_weight_and_do_not_change_the_context(name: str) -> None:
    query, keys, mask = inputs()
    att = scorer(name)
    context, weights = att(query, att.project_keys(keys), keys, mask)
    assert (weights.masked_select(~mask.unsqueeze(1)) == 0).all()
    assert torch.allclose(weights.sum(-1), torch.ones(B, T))
    # Garbage in the padded key positions changes nothing.
    noisy = keys.masked_fill(~mask.unsqueeze(-1), 1e4)
    context2, weights2 = att(query, att.project_keys(noisy), noisy, mask)
    torch.testing.assert_close(context2, context)
    torch.testing.assert_close(weights2, weights)


@pytest.mark.parametrize("dk", [DQ, DK])
def test_scaled_dot_scores_are_dot_scores_over_sqrt_d(dk: int) -> None:
    query, keys, _ = inputs(dk=dk)
    dot, scaled = scorer("dot", dk=dk), scorer("scaled_dot", dk=dk)
    scaled.load_state_dict(dot.state_dict())  # same key projection when sizes differ
    expected = dot.score(query, dot.project_keys(keys)) / math.sqrt(DQ)
    torch.testing.assert_close(scaled.score(query, scaled.project_keys(keys)), expected)


def test_dot_has_parameters_only_when_sizes_differ() -> None:
    assert list(DotAttention(query_size=8, key_size=8).parameters()) == []
    projected = DotAttention(query_size=8, key_size=12)
    assert [p.shape for p in projected.parameters()] == [(8, 12)]
    query, keys = torch.randn(2, 1, 8), torch.randn(2, 5, 12)
    assert projected.project_keys(keys).shape == (2, 5, 8)
    assert projected.score(query, projected.project_keys(keys)).shape == (2, 1, 5)


def test_bilinear_is_s_w_h() -> None:
    query, keys, _ = inputs()
    att = scorer("bilinear")
    assert isinstance(att, BilinearAttention)
    w = att.key_proj.weight  # (Dq, Dk)
    expected = torch.einsum("btq,qk,bsk->bts", query, w, keys)
    torch.testing.assert_close(att.score(query, att.project_keys(keys)), expected)


def test_concat_is_v_tanh_w_of_concatenation() -> None:
    query, keys, _ = inputs()
    att = scorer("concat")
    assert isinstance(att, ConcatAttention)
    w = torch.cat([att.query_proj.weight, att.key_proj.weight], dim=1)  # (A, Dq + Dk)
    pairs = torch.cat(
        [query.unsqueeze(2).expand(B, T, S, DQ), keys.unsqueeze(1).expand(B, T, S, DK)], dim=-1
    )  # (B, T, S, Dq + Dk)
    hidden = torch.tanh(pairs @ w.T + att.query_proj.bias)  # (B, T, S, A)
    expected = (hidden @ att.v.weight.T).squeeze(-1)
    torch.testing.assert_close(att.score(query, att.project_keys(keys)), expected)


def test_additive_hidden_is_tanh_through_a_sigmoid_in_float32_only() -> None:
    q, k = torch.randn(3, 4, 1, 8) * 3, torch.randn(3, 1, 5, 8) * 3
    hidden, sigmoid = additive_hidden(q, k)
    assert sigmoid and hidden.shape == (3, 4, 5, 8)
    torch.testing.assert_close(hidden * 2 - 1, torch.tanh(q + k))
    for dtype in (torch.bfloat16, torch.float16):  # half precision: tanh itself, bit for bit
        hidden, sigmoid = additive_hidden(q.to(dtype), k.to(dtype))
        assert not sigmoid and hidden.dtype == dtype
        assert torch.equal(hidden, torch.tanh(q.to(dtype) + k.to(dtype)))


def test_concat_scores_and_gradients_match_tanh_in_float64() -> None:
    """The float32 sigmoid route (`additive_hidden`) against vᵀ tanh(W_q s + b + W_k h)
    computed in float64 by autograd: scores and every gradient."""
    query, keys, _ = inputs()
    att = scorer("concat")
    params = [att.query_proj.weight, att.query_proj.bias, att.key_proj.weight, att.v.weight]
    query.requires_grad_(True)
    keys.requires_grad_(True)
    scores = att.score(query, att.project_keys(keys))
    up = torch.randn_like(scores)
    got = torch.autograd.grad((scores * up).sum(), [query, keys, *params])
    wide = [x.detach().double().requires_grad_(True) for x in (query, keys, *params)]
    wq, bq, wk, v = wide[2:]
    q = wide[0] @ wq.T + bq  # (B, T, A)
    hidden = torch.tanh(q.unsqueeze(2) + (wide[1] @ wk.T).unsqueeze(1))  # (B, T, S, A)
    expected = (hidden @ v.T).squeeze(-1)  # (B, T, S)
    want = torch.autograd.grad((expected * up.double()).sum(), wide)
    torch.testing.assert_close(scores.double(), expected, rtol=1e-5, atol=1e-5)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-5)


def _chunks_seen(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sentences of each hidden layer `additive_hidden` computes from here on."""
    seen: list[int] = []
    one_pass = attention.additive_hidden

    def spy(
        q: torch.Tensor, keys: torch.Tensor, out: torch.Tensor | None = None, *, decoding: bool
    ) -> tuple[torch.Tensor, bool]:
        seen.append(q.size(0))
        return one_pass(q, keys, out=out, decoding=decoding)

    monkeypatch.setattr(attention, "additive_hidden", spy)
    return seen


@pytest.mark.parametrize("tanh_fast", [False, True])
def test_concat_decoding_takes_tanh_where_it_is_fast_and_scores_alike(
    tanh_fast: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decoding (no gradients) computes the float32 hidden layer as tanh itself where
    `nmt.vml.TANH_FAST`, else as σ(2x); both give the scores of tanh in float64, chunked or not.
    With gradients the layer is always the sigmoid form (`nmt.recurrence`'s backward)."""
    monkeypatch.setattr(vml, "TANH_FAST", tanh_fast)
    q, k = torch.randn(3, 4, 1, 8) * 3, torch.randn(3, 1, 5, 8) * 3
    with torch.no_grad():
        hidden, sigmoid = additive_hidden(q, k, decoding=True)
    assert sigmoid is not tanh_fast
    torch.testing.assert_close(hidden if tanh_fast else hidden * 2 - 1, torch.tanh(q + k))
    assert additive_hidden(q, k)[1]  # training's
    query, keys, _ = inputs()
    att = scorer("concat")
    assert isinstance(att, ConcatAttention)
    wide = [x.double() for x in (query, keys, att.query_proj.weight, att.key_proj.weight)]
    qp = wide[0] @ wide[2].T + att.query_proj.bias.double()  # (B, T, A)
    hidden = torch.tanh(qp.unsqueeze(2) + (wide[1] @ wide[3].T).unsqueeze(1))  # (B, T, S, A)
    expected = (hidden @ att.v.weight.double().T).squeeze(-1)  # (B, T, S)
    for above in (1 << 40, 1):  # one pass, then chunks of one sentence
        monkeypatch.setattr(attention, "CHUNK_VALUES", T * S * att.v.in_features)
        monkeypatch.setattr(attention, "CHUNKED_ABOVE", above)
        with torch.no_grad():
            scores = att.score(query, att.project_keys(keys))
        torch.testing.assert_close(scores.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("per_chunk", [1, 2, 5])
def test_concat_decoding_scores_in_chunks_of_sentences_equal_one_pass(
    per_chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without gradients the hidden layer goes a few sentences at a time through one buffer
    (`chunked_scores`: `CHUNK_VALUES`, here 1, 2 or 5 of the 3 sentences a chunk, the last
    chunk shorter); the scores are those of one pass over all of them."""
    query, keys, _ = inputs()
    att = scorer("concat")
    assert isinstance(att, ConcatAttention)
    proj = att.project_keys(keys)
    whole = att.score(query, proj).detach()  # gradients on: one pass
    seen = _chunks_seen(monkeypatch)
    monkeypatch.setattr(attention, "CHUNK_VALUES", per_chunk * T * S * att.v.in_features)
    monkeypatch.setattr(attention, "CHUNKED_ABOVE", 1)
    with torch.no_grad():
        chunked = att.score(query, proj)
    assert seen == {1: [1, 1, 1], 2: [2, 1], 5: [3]}[per_chunk]
    torch.testing.assert_close(chunked, whole, rtol=1e-6, atol=1e-6)


def test_concat_scores_in_one_pass_small_with_gradients_or_in_another_dtype(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Chunks are for large float32 layers in decoding: at or below `CHUNKED_ABOVE` values
    (here the whole B·T·S·A), with gradients (training: the backward reads the whole layer)
    and in float64 the layer is one pass of all B sentences."""
    query, keys, _ = inputs()
    att = scorer("concat")
    assert isinstance(att, ConcatAttention)
    seen = _chunks_seen(monkeypatch)
    monkeypatch.setattr(attention, "CHUNK_VALUES", 1)
    monkeypatch.setattr(attention, "CHUNKED_ABOVE", B * T * S * att.v.in_features)
    with torch.no_grad():
        att.score(query, att.project_keys(keys))
    monkeypatch.setattr(attention, "CHUNKED_ABOVE", 1)
    att.score(query, att.project_keys(keys))
    wide = att.double()
    with torch.no_grad():
        wide.score(query.double(), wide.project_keys(keys.double()))
    assert seen == [B, B, B]


def test_concat_decoding_scores_against_one_sentence_of_keys_broadcast(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Keys of one sentence (1, S, A) broadcast against B sentences' queries: scored in one
    pass (slicing them by sentence would drop rows)."""
    query, keys, _ = inputs()
    att = scorer("concat")
    assert isinstance(att, ConcatAttention)
    proj = att.project_keys(keys[:1])  # (1, S, A)
    whole = att.score(query, proj).detach()  # (B, T, S)
    seen = _chunks_seen(monkeypatch)
    monkeypatch.setattr(attention, "CHUNK_VALUES", 1)
    monkeypatch.setattr(attention, "CHUNKED_ABOVE", 1)
    with torch.no_grad():
        torch.testing.assert_close(att.score(query, proj), whole, rtol=1e-6, atol=1e-6)
    assert seen == [B]


def test_concat_hidden_size_defaults_to_query_size() -> None:
    att = build_attention("concat", query_size=DQ, key_size=DK, hidden_size=None)
    assert isinstance(att, ConcatAttention)
    assert att.key_proj.out_features == DQ


def test_unknown_name_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="model.attention: unknown scoring function 'cosine'"):
        build_attention("cosine", query_size=4, key_size=4, hidden_size=None)


@pytest.mark.parametrize("name", list(ATTENTIONS))
def test_bf16_autocast_gives_finite_float32_weights_zero_on_pads(name: str) -> None:
    query, keys, mask = inputs()
    att = scorer(name)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        context, weights = att(query * 100, att.project_keys(keys), keys, mask)
    assert weights.dtype == torch.float32
    assert torch.isfinite(context).all() and torch.isfinite(weights).all()
    assert (weights.masked_select(~mask.unsqueeze(1)) == 0).all()
