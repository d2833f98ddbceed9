"""The vocabulary shortlist (`nmt.shortlist`): what it keeps, and that decoding with it gives
what the full output layer gives when the pieces the model wants are in it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from nmt import laid_out
from nmt.checkpoint import load_checkpoint, save_checkpoint
from nmt.model import build_model
from nmt.shortlist import COLUMN_MULTIPLE, Shortlist, build
from nmt.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer
from nmt.translate import Translator


def test_the_table_holds_each_source_pieces_best_associated_target_pieces():
    # source 10 is always with target 20, source 11 with 21; 30 is everywhere
    src = [[10, 12], [10, 13], [11, 12], [11, 13], [10], [11]]
    tgt = [[20, 30], [20, 30], [21, 30], [21, 30], [20, 30], [21, 30]]
    sl = build(src, tgt, src_vocab=40, tgt_vocab=40, joint=True, per_source=2, frequent=1)
    assert sl.frequent.tolist() == [30]
    assert sl.table[10].tolist()[0] == 20 and sl.table[11].tolist()[0] == 21
    assert 21 not in sl.table[10].tolist() and 20 not in sl.table[11].tolist()
    assert sl.table[5].tolist() == [-1, -1]  # never seen: nothing


def test_columns_keep_source_pieces_eos_and_unk_and_never_pad_or_bos():
    sl = Shortlist(
        frequent=torch.tensor([7, 8]),
        table=torch.tensor([[-1, -1]] * 10 + [[20, -1]] + [[-1, -1]] * 30),
        joint=True,
    )
    src = torch.tensor([[10, 33, EOS_ID], [33, PAD_ID, PAD_ID]])
    cols = sl.columns(src, 40).tolist()  # 40 < COLUMN_MULTIPLE: every allowed id
    assert cols == sorted(cols)
    assert {7, 8, 20, 10, 33, EOS_ID, UNK_ID} <= set(cols)
    assert PAD_ID not in cols and BOS_ID not in cols and -1 not in cols
    assert len(cols) == len(set(cols)) == 40 - 2
    table = torch.full((1000, 2), -1)
    table[10, 0] = 20
    separate = Shortlist(sl.frequent, table, joint=False)
    listed = separate.columns(torch.tensor([[10, 933, EOS_ID]]), 1000).tolist()
    assert 933 not in listed  # a source id is not a target id
    # 7, 8, 20, EOS, UNK: 5 listed, then the lowest absent ids (not PAD or BOS) up to 64
    assert len(listed) == COLUMN_MULTIPLE and listed == sorted(set(listed))
    named = {7, 8, 20, EOS_ID, UNK_ID}
    lowest = [i for i in range(1000) if i not in named | {PAD_ID, BOS_ID}][:59]
    assert sorted(set(listed) - named) == lowest


def test_a_column_count_already_a_multiple_gets_nothing_more():
    frequent = torch.arange(100, 100 + COLUMN_MULTIPLE - 2)  # with EOS and UNK: a multiple
    sl = Shortlist(frequent=frequent, table=torch.full((10, 1), -1), joint=False)
    cols = sl.columns(torch.tensor([[5, EOS_ID]]), 1000)
    assert cols.tolist() == sorted([EOS_ID, UNK_ID, *frequent.tolist()])


def test_the_restricted_output_layer_computes_exactly_its_columns(tiny_run):
    torch.manual_seed(0)
    tok = Tokenizer.load(tiny_run.run_dir)
    model = build_model(
        tiny_run.config.model,
        src_vocab_size=tok.src_vocab_size,
        tgt_vocab_size=tok.tgt_vocab_size,
        shared_vocab=tok.joint,
    ).eval()
    x = torch.randn(3, 5, tiny_run.config.model.dec_hidden)
    cols = torch.tensor([2, 5, 9, 17])
    full = model.generator(x)
    some = model.generator(x, model.generator.restrict(cols))
    assert some.shape == (3, 5, 4)
    torch.testing.assert_close(some, full[..., cols])


def _with_shortlist(run, tmp_path, **sizes):
    """`run`'s checkpoint with a shortlist built from its own training sentences."""
    tok = Tokenizer.load(run.run_dir)
    state = load_checkpoint(run.checkpoint)
    sl = build(
        tok.encode_src(run.train_src),
        tok.encode_tgt(run.train_tgt),
        src_vocab=tok.src_vocab_size,
        tgt_vocab=tok.tgt_vocab_size,
        joint=tok.joint,
        **sizes,
    )
    path = tmp_path / "with_shortlist.pt"
    save_checkpoint({**state, "shortlist": sl.to_state()}, path)
    return path


def test_a_shortlist_holding_the_chosen_pieces_changes_no_greedy_choice(tiny_run, tmp_path):
    full = Translator.from_checkpoint(tiny_run.checkpoint, shortlist=False)
    sentences = tiny_run.train_src[:12]
    wanted = full.translate(sentences, beam=1)
    chosen = sorted({full.tokenizer._tgt.piece_to_id(p) for t in wanted for p in t.tokens})
    # by hand: exactly the pieces the full model chose, nothing associated, no copying
    vocab = full.tokenizer.src_vocab_size
    hand = Shortlist(torch.tensor(chosen), torch.full((vocab, 1), -1), joint=False)
    path = tmp_path / "hand.pt"
    save_checkpoint({**load_checkpoint(tiny_run.checkpoint), "shortlist": hand.to_state()}, path)
    listed = Translator.from_checkpoint(path)
    cols = listed.model.shortlist.columns(torch.tensor([[5, 6]]), full.tokenizer.tgt_vocab_size)
    assert cols.numel() < full.tokenizer.tgt_vocab_size / 2  # a real cut
    assert [t.text for t in listed.translate(sentences, beam=1)] == [t.text for t in wanted]


def test_the_trained_shortlist_decodes_the_training_sentences_alike(tiny_run, tmp_path):
    path = _with_shortlist(tiny_run, tmp_path, per_source=10, frequent=20)
    listed = Translator.from_checkpoint(path)
    full = Translator.from_checkpoint(path, shortlist=False)
    assert listed.model.shortlist is not None and full.model.shortlist is None
    sentences = tiny_run.train_src[:12]
    for beam in (1, 3):
        a = [t.text for t in listed.translate(sentences, beam=beam)]
        b = [t.text for t in full.translate(sentences, beam=beam)]
        assert a == b
    ensemble = Translator.from_checkpoint([path, path])
    assert all(m.shortlist is None for m in ensemble.model.models)  # members' lists differ


def test_a_copy_model_still_copies_with_its_shortlist(tiny_copy_run, tmp_path):
    path = _with_shortlist(tiny_copy_run, tmp_path, per_source=1, frequent=2)
    listed = Translator.from_checkpoint(path)
    sentence = tiny_copy_run.train_src[0]
    out = listed.translate([sentence], beam=2)[0]
    src_ids = set(listed.tokenizer.encode_src([sentence])[0])
    vocab = listed.tokenizer.tgt_vocab_size
    cols = set(listed.model.shortlist.columns(torch.tensor([sorted(src_ids)]), vocab).tolist())
    assert src_ids <= cols  # every source piece can be copied
    assert out.text and out.copied is not None


def _cast_shapes(run: Callable[[], Any]) -> list[tuple[int, ...]]:
    """The input shape of every cast (`aten::_to_copy`) that `run()` makes."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        run()
    return [tuple(e.input_shapes[0]) for e in prof.events() if e.name == "aten::_to_copy"]


@pytest.mark.parametrize(
    "laid",
    [
        False,
        pytest.param(
            True,
            marks=pytest.mark.skipif(
                not laid_out.applies("cpu", "bf16"), reason="no bf16 units: autocast decodes"
            ),
        ),
    ],
    ids=["autocast", "laid-out"],
)
def test_bf16_decoding_casts_the_cut_output_layer_and_the_values_once_a_batch(
    tiny_run, tmp_path, monkeypatch, laid
):
    """Autocast caches the casts of parameters only: the batch's cut of the output layer and
    the encoder states (the attention's values) used to be cast again at every step. Either
    bf16 path: under autocast (a GPU, or a CPU without bf16 units), or on weights laid out
    once (`nmt.laid_out`, CPUs with them), whose cut is of bf16 rows already."""
    path = _with_shortlist(tiny_run, tmp_path, per_source=10, frequent=20)
    if not laid:
        monkeypatch.setattr(laid_out, "applies", lambda *_: False)
    tr = Translator.from_checkpoint(path, precision="bf16")
    cuts: list[tuple[int, ...]] = []
    restrict = tr.model.generator.restrict

    def recording(columns: torch.Tensor):  # noqa: ANN202
        cut = restrict(columns)
        weight = cut.weight.weight if isinstance(cut.weight, laid_out.LaidOut) else cut.weight
        assert isinstance(weight, torch.Tensor) and weight.dtype == torch.bfloat16
        cuts.append(tuple(weight.shape))
        return cut

    tr.model.generator.restrict = recording  # type: ignore[method-assign]
    steps = 0
    step = tr.model.step

    def counting(*args: Any):  # noqa: ANN202
        nonlocal steps
        steps += 1
        return step(*args)

    tr.model.step = counting  # type: ignore[method-assign]
    got: list[Any] = []
    sentences = tiny_run.train_src[:6]
    shapes = _cast_shapes(lambda: got.extend(tr.translate(sentences, beam=2, batch_size=6)))
    assert len(cuts) == 1 and steps > 4 and all(t.text for t in got)  # one batch, steps
    assert shapes.count(cuts[0]) == (0 if laid else 1)  # the cut: once, where it is made
    # (B, S, 2He): the values, and the keys' projection's input, once each, never per step
    width, rows = tiny_run.config.model.enc_hidden * 2, (6, 12)  # sentences, hypotheses
    assert sum(len(s) == 3 and s[0] in rows and s[-1] == width for s in shapes) <= 2
    fp32 = Translator.from_checkpoint(path)  # no autocast: the cut stays float32
    assert fp32.model.generator.restrict(torch.tensor([2, 5])).weight.dtype == torch.float32
