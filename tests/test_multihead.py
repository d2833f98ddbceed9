"""Multi-head attention (nmt.multihead): one head with identity projections is today's
scorer; heads are independent of the batch; the weights the model sees are the heads' mean;
the sizes the heads split are checked with the key's name."""

from __future__ import annotations

import re

import pytest
import torch

from nmt.attention import BilinearAttention, ConcatAttention, DotAttention, build_attention
from nmt.config import ConfigError, config_from_dict
from nmt.multihead import MultiHeadAttention

D = 6  # query, key and value size


def _identity(linear: torch.nn.Linear) -> None:
    with torch.no_grad():
        linear.weight.copy_(torch.eye(linear.weight.size(0), linear.weight.size(1)))


@pytest.mark.parametrize("kind", ["dot", "scaled_dot", "bilinear", "concat"])
def test_one_head_with_identity_projections_is_the_one_head_scorer(kind: str) -> None:
    """The generalisation of each scorer to heads, checked at H = 1: with W_v = W_o = I (and
    dot's W_q = W_k = I) the multi-head module computes the scorer's own numbers."""
    torch.manual_seed(0)
    plain = build_attention(kind, query_size=D, key_size=D, hidden_size=5)
    multi = MultiHeadAttention(kind, heads=1, query_size=D, key_size=D, hidden_size=5)
    _identity(multi.value_proj)
    _identity(multi.out_proj)
    with torch.no_grad():
        if isinstance(plain, ConcatAttention):
            assert multi.query_proj is not None and multi.v is not None
            multi.query_proj.load_state_dict(plain.query_proj.state_dict())
            multi.key_proj.load_state_dict(plain.key_proj.state_dict())
            multi.v.copy_(plain.v.weight)
        elif isinstance(plain, BilinearAttention):
            multi.key_proj.load_state_dict(plain.key_proj.state_dict())
        else:
            assert isinstance(plain, DotAttention) and multi.query_proj is not None
            _identity(multi.query_proj)
            _identity(multi.key_proj)
    keys, query = torch.randn(3, 5, D), torch.randn(3, 4, D)
    mask = torch.tensor([[True] * 5, [True] * 2 + [False] * 3, [True] * 4 + [False]])
    want = plain(query, plain.project_keys(keys), keys, mask)
    got = multi(query, multi.project_keys(keys), keys, mask)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_one_head_builds_todays_scorer_with_todays_parameters() -> None:
    """attention_heads: 1 (the default) is not a multi-head module: checkpoints of models
    made before heads existed load unchanged."""
    att = build_attention("bilinear", query_size=D, key_size=D, hidden_size=None, heads=1)
    assert type(att) is BilinearAttention
    assert [n for n, _ in att.named_parameters()] == ["key_proj.weight"]


@pytest.mark.parametrize("kind", ["dot", "scaled_dot", "bilinear", "concat"])
def test_heads_are_batch_independent_and_their_mean_is_the_weights(kind: str) -> None:
    torch.manual_seed(0)
    att = build_attention(kind, query_size=8, key_size=D, hidden_size=4, heads=2)
    keys, query = torch.randn(2, 5, D), torch.randn(2, 3, 8)
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    proj = att.project_keys(keys)
    context, weights = att(query, proj, keys, mask)
    _, heads = att(query, proj, keys, mask, heads=True)
    assert heads.shape == (2, 2, 3, 5)
    torch.testing.assert_close(heads.mean(1), weights)
    torch.testing.assert_close(heads.sum(-1), torch.ones(2, 2, 3))
    assert (heads[1, :, :, 3:] == 0).all()
    assert not torch.allclose(heads[:, 0], heads[:, 1])  # the heads look differently
    alone_keys = keys[1:, :3]
    alone = att(query[1:], att.project_keys(alone_keys), alone_keys, mask[1:, :3])
    torch.testing.assert_close(alone[0], context[1:], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(alone[1], weights[1:, :, :3], rtol=1e-5, atol=1e-6)
    # one step at a time gives the rows of all steps at once
    for t in range(3):
        c, w = att(query[:, t], proj, keys, mask, heads=True)
        torch.testing.assert_close(c, context[:, t], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(w, heads[:, :, t])


@pytest.mark.parametrize(
    "model, problem",
    [
        ({"attention_heads": 3}, "3 heads must divide dec_hidden (512)"),
        (
            {"attention_heads": 8, "enc_hidden": 6, "dec_hidden": 8},
            "8 heads must divide 2 x enc_hidden (12)",
        ),
        (
            {"attention_heads": 4, "attention": "concat", "attention_size": 6},
            "4 heads must divide attention_size (6)",
        ),
    ],
)
def test_heads_that_do_not_divide_a_size_are_refused_naming_it(model: dict, problem: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"model.attention_heads: {problem}")):
        config_from_dict({"model": model})


# --------------------------------------------------------------------------- decoding, shown


def test_a_multi_head_checkpoint_gives_each_heads_weights_whose_mean_is_the_attention(
    tiny_heads_run,
):
    from nmt.translate import Translator

    translator = Translator.from_checkpoint(tiny_heads_run.run_dir)
    assert translator.heads == 2
    sentences = tiny_heads_run.train_src[:4]
    for beam in (1, 3):
        plain = translator.translate(sentences, beam=beam)
        shown = translator.translate(sentences, beam=beam, with_heads=True)
        for p, t in zip(plain, shown, strict=True):
            assert p.heads is None and p.text == t.text and t.heads is not None
            assert t.heads.shape == (2, *t.attention.shape)
            torch.testing.assert_close(t.heads.mean(0), t.attention, atol=1e-5, rtol=0)
            torch.testing.assert_close(t.attention_of(2), t.heads[1])
            assert t.copied is not None  # copy attention works with heads and local-p


def test_translate_shows_one_head_on_request_and_refuses_a_head_the_model_lacks(tiny_heads_run):
    from test_cli import assert_one_line_error, runner

    from nmt.cli import app

    model = ["--model", str(tiny_heads_run.run_dir)]
    sentence = tiny_heads_run.train_src[0]
    shown = runner.invoke(app, ["translate", sentence, *model, "--show-attention", "--head", "2"])
    assert shown.exit_code == 0, shown.output
    assert "attention head 2:" in shown.stdout
    mean = runner.invoke(app, ["translate", sentence, *model, "--show-attention"])
    assert "attention head" not in mean.stdout and mean.stdout != shown.stdout
    too_many = runner.invoke(
        app, ["translate", sentence, *model, "--show-attention", "--head", "3"]
    )
    assert_one_line_error(too_many, "--head 3: the model has 2 attention head(s)")
    negative = runner.invoke(app, ["translate", sentence, *model, "--show-attention", "--head=-1"])
    assert_one_line_error(negative, "--head -1: expected 1 to the model's heads")
    nothing_shown = runner.invoke(app, ["translate", sentence, *model, "--head", "1"])
    assert_one_line_error(nothing_shown, "--head 1: shows with --show-attention")
    pair = ["--model", str(tiny_heads_run.checkpoint), "--model", str(tiny_heads_run.run_dir)]
    ensemble = runner.invoke(app, ["translate", sentence, *pair, "--show-attention", "--head", "1"])
    assert_one_line_error(ensemble, "--head 1: an ensemble's heads")


def test_the_api_returns_each_heads_weights_when_asked(tiny_heads_run):
    from fastapi.testclient import TestClient

    from nmt.serve import create_app
    from nmt.translate import Translator

    translator = Translator.from_checkpoint(tiny_heads_run.run_dir)
    text = tiny_heads_run.train_src[0]
    with TestClient(create_app(translator)) as client:
        r = client.post("/translate", json={"text": text, "attention": True, "heads": True})
        att = r.json()["translations"][0]["attention"]
        assert len(att["heads"]) == 2
        assert all(len(h) == len(att["weights"]) for h in att["heads"])
        plain = client.post("/translate", json={"text": text, "attention": True}).json()
        assert "heads" not in plain["translations"][0]["attention"]
        r = client.post("/translate", json={"text": text, "heads": True})
        assert r.status_code == 422 and r.json()["detail"].startswith("heads: ")
