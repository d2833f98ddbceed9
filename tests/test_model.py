"""Tests for nmt.model: shapes, padding invariance, step = forward, gradients, overfitting."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from nmt.config import ModelConfig, config_from_dict
from nmt.model import Seq2Seq, build_model
from nmt.runtime import autocast

PAD, BOS, EOS = 0, 2, 3
V = 23
TINY = {"emb_size": 8, "enc_hidden": 6, "dec_hidden": 10}  # 2 x 6 != 10: dot needs its projection
SCORERS = ["dot", "scaled_dot", "bilinear", "concat"]
STYLES: dict[str, dict[str, Any]] = {
    "bahdanau": {"decoder": "bahdanau"},
    "luong": {"decoder": "luong", "input_feeding": False},
    "luong_feeding": {"decoder": "luong", "input_feeding": True},
}
COMBOS = [
    pytest.param({"attention": a, **STYLES[s]}, id=f"{a}-{s}")
    for a, s in itertools.product(SCORERS, STYLES)
]


def model_config(**keys: Any) -> ModelConfig:
    return config_from_dict({"model": {**TINY, **keys}}).model


def make_model(**keys: Any) -> Seq2Seq:
    torch.manual_seed(0)
    cfg = model_config(**keys)
    return build_model(cfg, src_vocab_size=V, tgt_vocab_size=V, shared_vocab=True)


def pad_batch(seqs: list[list[int]]) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    return torch.tensor([s + [PAD] * (width - len(s)) for s in seqs])


def sentence_pair(src_len: int, tgt_len: int, seed: int) -> tuple[list[int], list[int]]:
    """Source of src_len tokens ending in EOS, target input of tgt_len tokens starting with BOS."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (src_len - 1,), generator=gen).tolist() + [EOS]
    tgt = [BOS] + torch.randint(4, V, (tgt_len - 1,), generator=gen).tolist()
    return src, tgt


def batch(
    shapes: list[tuple[int, int]], seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Padded src (B, S), src_lens (B,), padded tgt_in (B, T) for (src_len, tgt_len) pairs."""
    pairs = [sentence_pair(s, t, seed + i) for i, (s, t) in enumerate(shapes)]
    src = pad_batch([p[0] for p in pairs])
    return src, torch.tensor([s for s, _ in shapes]), pad_batch([p[1] for p in pairs])


SHAPES = [(7, 5), (4, 3), (5, 6)]  # the second sentence is padded on both sides


@pytest.mark.parametrize("keys", COMBOS)
def test_output_shapes_and_attention_rows(keys: dict[str, Any]) -> None:
    model = make_model(**keys).eval()
    src, lens, tgt_in = batch(SHAPES)
    out = model(src, lens, tgt_in)
    logits, attention = out.logits, out.attention
    assert logits.shape == (3, 6, V)
    assert attention.shape == (3, 6, 7)
    assert torch.allclose(attention.sum(-1), torch.ones(3, 6))
    mask = torch.arange(7) < lens.unsqueeze(1)  # (B, S)
    assert (attention.masked_select(~mask.unsqueeze(1)) == 0).all()


@pytest.mark.parametrize("cell", ["gru", "lstm"])
@pytest.mark.parametrize("keys", COMBOS)
def test_sentence_alone_equals_sentence_padded_in_a_batch(keys: dict[str, Any], cell: str) -> None:
    model = make_model(**keys, cell=cell, enc_layers=2, dec_layers=2).eval()
    src, lens, tgt_in = batch(SHAPES)
    out = model(src, lens, tgt_in)
    logits, attention = out.logits, out.attention
    alone_src, alone_lens, alone_tgt = src[1:2, :4], lens[1:2], tgt_in[1:2, :3]
    out = model(alone_src, alone_lens, alone_tgt)
    alone_logits, alone_attention = out.logits, out.attention
    torch.testing.assert_close(logits[1:2, :3], alone_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(attention[1:2, :3, :4], alone_attention, atol=1e-5, rtol=0)
    assert (attention[1, :, 4:] == 0).all()


@pytest.mark.parametrize("keys", COMBOS)
def test_step_by_step_decoding_equals_teacher_forced_forward(keys: dict[str, Any]) -> None:
    model = make_model(**keys).eval()
    src, lens, tgt_in = batch(SHAPES)
    out = model(src, lens, tgt_in)
    logits, attention = out.logits, out.attention
    enc = model.encode(src, lens)
    state = model.init_state(enc)
    for t in range(tgt_in.size(1)):
        step_logits, state, step_attention = model.step(tgt_in[:, t], state, enc)
        torch.testing.assert_close(step_logits, logits[:, t], atol=1e-5, rtol=0)
        torch.testing.assert_close(step_attention, attention[:, t], atol=1e-5, rtol=0)


@pytest.mark.parametrize("cell", ["gru", "lstm"])
@pytest.mark.parametrize("attention", SCORERS)
def test_luong_parallel_fast_path_equals_step_by_step(attention: str, cell: str) -> None:
    # One RNN call + one batched attention against the per-step code path the search uses.
    model = make_model(decoder="luong", attention=attention, cell=cell, dec_layers=2).eval()
    src, lens, tgt_in = batch(SHAPES)
    enc = model.encode(src, lens)
    emb = model.tgt_embed(tgt_in)  # (B, T, E)
    fast, fast_attention = model.decoder(emb, model.init_state(enc), enc)
    state = model.init_state(enc)
    for t in range(tgt_in.size(1)):
        out, state, weights = model.decoder.step(emb[:, t], state, enc)
        torch.testing.assert_close(out, fast[:, t], atol=1e-5, rtol=0)
        torch.testing.assert_close(weights, fast_attention[:, t], atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"cell": "lstm", "enc_layers": 2, "dec_layers": 2},
        {"cell": "lstm", "dec_layers": 2, "bridge": "none"},
        {"tie_embeddings": False, "share_embeddings": True},
    ],
    ids=["gru", "lstm-2-layers", "lstm-no-bridge", "shared-untied"],
)
@pytest.mark.parametrize("keys", COMBOS)
def test_gradients_reach_every_parameter(keys: dict[str, Any], extra: dict[str, Any]) -> None:
    model = make_model(**keys, **extra, dropout=0.1).train()
    src, lens, tgt_in = batch(SHAPES)
    logits = model(src, lens, tgt_in).logits
    logits.sum().backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, f"{name} got no gradient"
        assert param.grad.abs().sum() > 0, f"{name} got a zero gradient"


def test_encoded_and_state_select_follow_the_index() -> None:
    # What beam search does: expand sentences, then reorder hypotheses mid-way.
    model = make_model(decoder="luong", input_feeding=True, cell="lstm").eval()
    src, lens, tgt_in = batch(SHAPES)
    enc = model.encode(src, lens)
    state = model.init_state(enc)
    logits, state, _ = model.step(tgt_in[:, 0], state, enc)
    index = torch.tensor([2, 0, 0])
    sel_logits, _, sel_attention = model.step(
        tgt_in[index, 1], state.select(index), enc.select(index)
    )
    ref_logits, _, ref_attention = model.step(tgt_in[:, 1], state, enc)
    torch.testing.assert_close(sel_logits, ref_logits[index])
    torch.testing.assert_close(sel_attention, ref_attention[index])


@pytest.mark.parametrize(("enc_layers", "dec_layers"), [(2, 2), (1, 3), (3, 2)])
def test_linear_bridge_maps_encoder_layers_to_decoder_layers(
    enc_layers: int, dec_layers: int
) -> None:
    model = make_model(enc_layers=enc_layers, dec_layers=dec_layers).eval()
    src, lens, _ = batch(SHAPES)
    h0 = model.encode(src, lens).final
    assert h0.shape == (dec_layers, 3, TINY["dec_hidden"])
    same = all(torch.equal(h0[0], h0[i]) for i in range(1, dec_layers))
    assert same == (enc_layers != dec_layers)  # layer-wise only when the counts match


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_copy_bridge_starts_the_decoder_from_the_encoder_final_states(cell: str) -> None:
    model = make_model(bridge="copy", cell=cell, enc_hidden=5, dec_hidden=10).eval()
    assert model.bridge is not None and not list(model.bridge.parameters())
    src, lens, _ = batch(SHAPES)
    emb = model.src_embed(src)
    _, final, final_cell = model.encoder(emb, lens)  # (1, B, 2He) forward ; backward
    enc = model.encode(src, lens)
    torch.testing.assert_close(enc.final, final)
    if cell == "lstm":
        torch.testing.assert_close(enc.final_cell, final_cell)


def test_feed_dropout_drops_the_output_once_and_feeds_the_dropped_one_back() -> None:
    """model.feed_dropout (OpenNMT-py's placement): h̃_t times its mask is both the output and
    what step t + 1 reads; the output layer drops nothing more; evaluation drops nothing."""
    model = make_model(decoder="luong", input_feeding=True, dropout=0.5, feed_dropout=True)
    model.train().dropout.p = 0.0  # the embeddings kept: only the feed's masks are drawn
    assert model.generator.dropout.p == 0.0
    dec = model.decoder
    dec.fused = False  # the step-by-step path: test_recurrence holds the fused loop to it
    src, lens, tgt = batch(SHAPES)
    enc = model.encode(src, lens)
    emb = model.tgt_embed(tgt)  # (B, T, E)
    (B, T), H = tgt.shape, dec.output_size
    with torch.no_grad():
        torch.manual_seed(1)
        dropped, _ = dec(emb, dec.init_state(enc), enc)  # (B, T, H)
        torch.manual_seed(1)
        masks = dec.feed_dropout.mask((T, B, H), emb)  # the same draws: (T, B, H)
        dec.eval()
        clean, _ = dec(emb, dec.init_state(enc), enc)
    assert masks is not None
    # step 0 reads the initial feed only: its output is the clean one, masked
    torch.testing.assert_close(dropped[:, 0], clean[:, 0] * masks[0])
    # step 1 reads the dropped h̃_0: beyond its own mask it differs from the clean run's
    kept = masks[1] > 0
    assert not torch.allclose(dropped[:, 1][kept], (clean[:, 1] * masks[1])[kept], atol=1e-4)


@pytest.mark.parametrize("output", ["tanh", "linear"])
def test_luong_attentional_output_is_tanh_or_linear_with_a_bias(output: str) -> None:
    """Luong's h̃ = tanh(W_c [c; s]) with no bias (checkpoints of before load unchanged);
    linear: W_c [c; s] + b, OpenNMT-py's mlp attention output, unbounded."""
    model = make_model(decoder="luong", input_feeding=True, attention_output=output).eval()
    combine = model.decoder.combine
    assert (combine.bias is not None) == (output == "linear")
    with torch.no_grad():
        combine.weight.mul_(20.0)  # drive tanh to saturation: only linear goes past 1
    s = torch.randn(3, 10)  # (B, Hd) decoder states
    with torch.no_grad():
        enc = model.encode(*batch(SHAPES)[:2])
        out, _ = model.decoder._attend(s, enc, 0)
        context, _ = model.decoder.attention(s, enc.keys, enc.states, enc.mask)
        want = combine(torch.cat([context, s], dim=-1))
    torch.testing.assert_close(out, want if output == "linear" else torch.tanh(want))
    assert (out.abs().max() > 1) == (output == "linear")


def test_no_bridge_starts_the_decoder_from_zeros() -> None:
    model = make_model(bridge="none", cell="lstm").eval()
    src, lens, _ = batch(SHAPES)
    enc = model.encode(src, lens)
    assert enc.final_cell is not None
    assert not enc.final.any() and not enc.final_cell.any()


def test_tied_and_shared_embeddings() -> None:
    model = make_model(tie_embeddings=True, share_embeddings=True)
    assert model.generator.out.weight is model.tgt_embed.weight
    assert model.src_embed is model.tgt_embed
    # Pre-output size 10 != embedding size 8: a projection makes tying possible.
    assert model.generator.proj is not None and model.generator.proj.out_features == 8
    untied = make_model(tie_embeddings=False)
    assert untied.generator.proj is None
    assert untied.generator.out.weight is not untied.tgt_embed.weight
    assert untied.src_embed is not untied.tgt_embed


def test_shared_embeddings_need_a_joint_vocabulary() -> None:
    cfg = model_config(share_embeddings=True)
    with pytest.raises(ValueError, match="model.share_embeddings: needs one joint vocabulary"):
        build_model(cfg, src_vocab_size=V, tgt_vocab_size=V + 1, shared_vocab=False)


@pytest.mark.parametrize("style", list(STYLES))
def test_bf16_autocast_forward_is_finite_with_zero_attention_on_pads(style: str) -> None:
    model = make_model(**STYLES[style], cell="lstm").eval()
    src, lens, tgt_in = batch(SHAPES)
    with autocast(torch.device("cpu"), "bf16"):  # the project's, as training uses it
        out = model(src, lens, tgt_in)
        logits, attention = out.logits, out.attention
    assert torch.isfinite(logits).all() and torch.isfinite(attention).all()
    mask = torch.arange(7) < lens.unsqueeze(1)  # (B, S)
    assert (attention.masked_select(~mask.unsqueeze(1)) == 0).all()
    reference = model(src, lens, tgt_in).logits
    torch.testing.assert_close(logits.float(), reference, atol=0.05, rtol=0.05)


@pytest.mark.parametrize("style", list(STYLES))
def test_tiny_model_overfits_32_sentence_pairs(style: str) -> None:
    torch.manual_seed(0)
    cfg = model_config(
        **STYLES[style], emb_size=32, enc_hidden=32, dec_hidden=64, attention="concat", dropout=0.0
    )
    model = build_model(cfg, src_vocab_size=V, tgt_vocab_size=V, shared_vocab=True)
    gen = torch.Generator().manual_seed(1)
    lengths = torch.randint(3, 10, (32, 2), generator=gen).tolist()
    # Random pairs: a near-zero loss means memorising them, and the first target token can only
    # come from the source (without it the loss stays above ~0.3).
    pairs = [sentence_pair(s, t, seed=i) for i, (s, t) in enumerate(lengths)]
    src, lens = pad_batch([s for s, _ in pairs]), torch.tensor([s for s, _ in lengths])
    tgt_in = pad_batch([t for _, t in pairs])
    tgt_out = pad_batch([t[1:] + [EOS] for _, t in pairs])
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(80):
        logits = model(src, lens, tgt_in).logits
        loss = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.01


def test_uniform_init_draws_every_weight_within_the_range_and_keeps_padding_zero() -> None:
    model = make_model(init="uniform", init_range=0.05)
    for name, p in model.named_parameters():
        assert p.abs().max() <= 0.05, name
        if p.numel() >= 100:  # drawn over the whole range, not left at the default
            assert p.abs().max() > 0.045, name
    assert not model.tgt_embed.weight[PAD].any() and not model.src_embed.weight[PAD].any()


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_a_model_built_to_be_loaded_draws_nothing_and_loads_to_the_same_model(cell: str) -> None:
    keys = {"cell": cell, **STYLES["luong_feeding"]}
    trained = make_model(**keys).eval()
    rng = torch.get_rng_state()
    loaded = build_model(
        model_config(**keys),
        src_vocab_size=V,
        tgt_vocab_size=V,
        shared_vocab=True,
        initialise=False,
    )
    assert torch.equal(torch.get_rng_state(), rng)  # not one random number drawn
    loaded.load_state_dict(trained.state_dict())
    src, src_lens, tgt_in = batch(SHAPES)
    got, want = loaded.eval()(src, src_lens, tgt_in), trained(src, src_lens, tgt_in)
    assert torch.equal(got.logits, want.logits)
    # The layers' own initialisation is back for the next model: the same seed, the same draw.
    again = make_model(**keys).state_dict()
    assert all(torch.equal(again[k], v) for k, v in trained.state_dict().items())
