"""int8 decoding (nmt.int8): which layers are quantized, and what it does to a tiny model's
translations and BLEU (on its own training sentences: a tolerance, not a quality claim)."""

from __future__ import annotations

import pytest
from torch import nn

from nmt.errors import NmtError
from nmt.evaluate import bleu
from nmt.int8 import quantize
from nmt.translate import Translator

# How far int8 may move the tiny model's BLEU on its training sentences, in points: its
# weights' rounding changes a few near-tie choices, not what the model learnt.
TOLERANCE = 5.0


@pytest.mark.parametrize("run", ["tiny_run", "tiny_heads_run"])
def test_int8_decoding_stays_within_the_tolerance_of_float32(run, request):
    tiny = request.getfixturevalue(run)
    sentences, refs = tiny.train_src[:24], tiny.train_tgt[:24]
    full = Translator.from_checkpoint(tiny.run_dir)
    int8 = Translator.from_checkpoint(tiny.run_dir, int8=True)
    for beam in (1, 3):
        want = [t.text for t in full.translate(sentences, beam=beam)]
        got = int8.translate(sentences, beam=beam)
        assert abs(bleu([t.text for t in got], refs).score - bleu(want, refs).score) <= TOLERANCE
        assert sum(g.text == w for g, w in zip(got, want, strict=True)) >= len(want) // 2


def test_rnns_and_linear_layers_are_quantized_but_not_the_output_layer(tiny_copy_run):
    model = Translator.from_checkpoint(tiny_copy_run.run_dir, int8=True).model
    plain = [n for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.GRU))]
    assert plain == ["generator.out"]  # every other product layer now holds int8 weights
    assert type(model.decoder.rnn).__module__.startswith("torch.ao.nn.quantized.dynamic")


def test_int8_is_refused_off_the_cpu():
    with pytest.raises(NmtError, match="--int8: CPU decoding only"):
        quantize(nn.Linear(2, 2), "cuda")


def test_translate_int8_prints_the_translation_and_no_warnings(tiny_run):
    from test_cli import runner

    from nmt.cli import app

    sentence = tiny_run.train_src[0]
    args = ["translate", sentence, "--model", str(tiny_run.run_dir), "--device", "cpu"]
    result = runner.invoke(app, [*args, "--int8"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() and result.stderr == ""
