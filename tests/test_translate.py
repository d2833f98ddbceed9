"""Translator and `nmt translate`: order, batching, empty and long inputs, any Unicode,
n-best, attention as text and PNG, input from arguments, stdin and files."""

from __future__ import annotations

import dataclasses
import gc
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from nmt.batching import collate
from nmt.checkpoint import CheckpointError
from nmt.cli import app
from nmt.display import format_attention, plot_attention, plot_paths
from nmt.errors import DecodeArgumentError
from nmt.files import MAX_LINE_BYTES, FileError, read_lines
from nmt.search import Hypothesis, greedy
from nmt.tokenizer import UNK_ID
from nmt.translate import EOS_PIECE, Translator

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def translator(tiny_run) -> Translator:
    return Translator.from_checkpoint(tiny_run.run_dir)


@pytest.fixture
def sentences(tiny_run) -> list[str]:
    return tiny_run.train_src[:7]


def test_from_checkpoint_takes_a_run_dir_or_a_file(tiny_run, translator):
    by_file = Translator.from_checkpoint(tiny_run.checkpoint)
    assert translator.path == by_file.path == tiny_run.checkpoint
    assert translator.config.decode == tiny_run.config.decode


def test_loading_puts_the_loaded_objects_out_of_the_collectors_reach(tiny_run):
    """nmt.runtime.freeze_gc: the model's tensors are frozen, so no full collection walks
    them (or torch's hundreds of thousands of objects) in the middle of a translation."""
    tr = Translator.from_checkpoint(tiny_run.run_dir)
    assert gc.is_tracked(tr.model) and gc.get_freeze_count() > 0
    # the collector's generations no longer hold it: only the permanent one does
    assert not any(o is tr.model for o in gc.get_objects())


def test_no_model_and_no_latest_run_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError, match="no trained run found"):
        Translator.from_checkpoint(None)
    # a link to a run deleted since (a benchmark's in /tmp): says which, not "none found"
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "latest").symlink_to(tmp_path / "gone")
    with pytest.raises(CheckpointError, match=f"runs/latest names {tmp_path / 'gone'}, which is"):
        Translator.from_checkpoint(None)


def test_outputs_come_back_in_input_order_whatever_the_batching(translator, sentences):
    one_batch = translator.translate(sentences, beam=3, batch_size=64)
    small = translator.translate(sentences, beam=3, batch_size=2)
    alone = [translator.translate([s], beam=3)[0] for s in sentences]
    assert [t.source for t in one_batch] == sentences
    for a, b, c in zip(one_batch, small, alone, strict=True):
        assert a.text == b.text == c.text
        assert a.score == pytest.approx(b.score, abs=1e-5)
        assert a.score == pytest.approx(c.score, abs=1e-5)


def test_the_overfitted_model_translates_a_training_sentence(tiny_run, translator):
    # 60 steps on 48 pairs: the start of a training sentence comes out right.
    (t,) = translator.translate([tiny_run.train_src[0]], beam=3)
    assert t.text.split()[:2] == tiny_run.train_tgt[0].split()[:2]


def test_beam_one_is_greedy_search(translator, sentences):
    out = translator.translate(sentences, beam=1)
    tok = translator.tokenizer
    batch = collate(tok.encode_src(sentences), None, range(len(sentences)))
    dc = translator.config.decode
    result = greedy(
        translator.model,
        batch.src,
        batch.src_lens,
        max_len_ratio=dc.max_len_ratio,
        max_len_const=dc.max_len_const,
        min_len=dc.min_len,
    )
    in_order = sorted(zip(batch.index.tolist(), result.best, strict=True), key=lambda x: x[0])
    assert [t.text for t in out] == tok.decode_tgt([h.tokens for _, h in in_order])


def test_nbest_lists_distinct_translations_best_first(translator, sentences):
    for t in translator.translate(sentences[:3], beam=4, nbest=4):
        assert len(t.nbest) == 4
        assert t.nbest[0] == (t.text, t.score)
        texts = [text for text, _ in t.nbest]
        assert len(set(texts)) == 4, texts  # four different outputs, not one repeated
        scores = [s for _, s in t.nbest]
        assert scores == sorted(scores, reverse=True)
        assert len(set(scores)) == 4


def test_a_sentence_is_tokenized_once(tiny_run, sentences, monkeypatch):
    t = Translator.from_checkpoint(tiny_run.run_dir)
    calls: list[int] = []
    processor = t.tokenizer._src
    encode = processor.encode

    def counted(text, *args, **kwargs):
        calls.append(len(text) if isinstance(text, list) else 1)
        return encode(text, *args, **kwargs)

    monkeypatch.setattr(processor, "encode", counted)
    out = t.translate([*sentences, "zzq 🙂 ẞ"], beam=2, nbest=2)
    assert calls == [len(sentences) + 1]  # one call, every sentence once
    expected = [*t.tokenizer.src_pieces(" ".join(sentences[0].split())), EOS_PIECE]
    assert out[0].src_tokens == expected
    prepared = t.prepare(sentences)
    calls.clear()
    assert [x.text for x in t.translate(prepared, beam=2)] == [x.text for x in out[:-1]]
    assert calls == []  # prepared sources are not tokenized again


def test_nbest_above_beam_is_refused(translator):
    with pytest.raises(DecodeArgumentError, match=r"^nbest 4: expected 1 to the beam size"):
        translator.translate(["A dog."], beam=3, nbest=4)
    with pytest.raises(DecodeArgumentError, match=r"^beam 0: expected at least 1"):
        translator.translate(["A dog."], beam=0)
    with pytest.raises(DecodeArgumentError, match=r"^batch_size 0: expected at least 1"):
        translator.translate(["A dog."], batch_size=0)


def test_empty_lines_give_empty_translations_without_the_model(tiny_run):
    t = Translator.from_checkpoint(tiny_run.run_dir)

    class NoModel:
        def __getattr__(self, name):
            raise AssertionError("the model was run for an empty input")

    t.model = NoModel()  # type: ignore[assignment]
    out = t.translate(["", "   ", "\t"])
    assert [x.text for x in out] == ["", "", ""]
    assert all(x.attention.shape == (0, 0) for x in out)


def test_long_inputs_are_cut_to_max_len_with_a_warning(translator, sentences):
    messages: list[str] = []
    cfg = translator.config
    short = Translator(
        model=translator.model,
        tokenizer=translator.tokenizer,
        config=dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, max_len=4)),
        device=translator.device,
        precision="fp32",
        path=None,
        log=messages.append,
    )
    out = short.translate([sentences[0], "A dog."], beam=2)
    assert len(messages) == 1 and "line(s) 1" in messages[0] and "data.max_len" in messages[0]
    assert out[0].truncated and not out[1].truncated
    assert len(out[0].src_tokens) == 4 + 1  # the first 4 pieces, then EOS
    assert out[0].attention.shape[1] == 5


def test_the_default_log_is_a_python_warning(tiny_run):
    t = Translator.from_checkpoint(tiny_run.run_dir)
    t.config = dataclasses.replace(t.config, data=dataclasses.replace(t.config.data, max_len=2))
    with pytest.warns(UserWarning, match="longer than the model's 2 subword tokens"):
        t.translate(["A dog runs in the park."])


def test_unseen_characters_and_any_unicode(translator):
    inputs = ["日本語の文 ☕ 🐕", "Zoë's naïve café — «ok»", "\u2028weird\u200bspaces\u00a0here"]
    out = translator.translate(inputs, beam=2)
    assert [t.source for t in out] == inputs
    tok = translator.tokenizer
    for t, text in zip(out, inputs, strict=True):
        # The model read every piece of the input (unknown characters as <unk>), then EOS ...
        assert t.src_tokens == tok.src_pieces(" ".join(text.split())) + [EOS_PIECE]
        assert t.attention.shape == (len(t.tgt_labels), len(t.src_tokens))
        # ... and the output is text the tokenizer itself would give for those pieces.
        assert t.text == tok.decode_tgt([tok.encode_tgt([t.text])[0]])[0] or not t.text
    alone = [translator.translate([text], beam=2)[0].text for text in inputs]
    assert [t.text for t in out] == alone


def test_capitals_are_read_in_sentence_case_and_answered_in_capitals(translator):
    shouted, calm = translator.translate(["A DOG RUNS IN THE PARK!", "A dog runs in the park!"])
    assert shouted.text == calm.text.upper() and shouted.text != calm.text
    assert shouted.source == "A DOG RUNS IN THE PARK!"
    # a capital word in a sentence, or one capital letter, is how the user wrote it
    for text in ("A dog runs in the NASA park.", "I", "42 \U0001f415"):
        (t,) = translator.translate([text])
        assert t.src_tokens[:-1] == translator.tokenizer.src_pieces(text)
    (summer,) = translator.translate(["\u00c9T\u00c9 2024"])  # ÉTÉ: read as "Été 2024"
    assert summer.src_tokens[:-1] == translator.tokenizer.src_pieces("\u00c9t\u00e9 2024")


@pytest.mark.parametrize(
    ("source", "head", "tail", "expected"),
    [
        ("A dog \U0001f415 runs.", "Un chien", "court.", "Un chien \U0001f415 court."),
        ("A dog \U0001f327", "Un chien", "", "Un chien \U0001f327"),
        # Inside a word in the source, inside it in the translation (Z, <unk>, rich: Zürich).
        ("A do\U0001f415g runs.", "Un chi", "en court.", "Un chi\U0001f415en court."),
        ("\U0001f415s run.", "", "s courent.", "\U0001f415s courent."),
    ],
)
def test_unknown_target_pieces_copy_the_source_text_they_attend_to(
    translator, monkeypatch, source, head, tail, expected
):
    """An emoji is <unk> to the vocabulary: the output's <unk> becomes the source text under
    its strongest attention (here made to point at the emoji), spaced as in the source."""
    tok = translator.tokenizer
    surfaces = tok.encode_src_pieces([source])[0].surfaces
    unknown = next(
        j for j, piece in enumerate(surfaces) if "\U0001f415" in piece or "\U0001f327" in piece
    )
    assert tok.encode_src([source])[0][unknown] == UNK_ID
    head_ids = tok.encode_tgt([head])[0] if head else []
    tokens = [*head_ids, UNK_ID, *(tok.encode_tgt([tail])[0] if tail else [])]
    attention = torch.full((len(tokens) + 1, len(surfaces) + 1), 0.01)
    attention[len(head_ids), unknown] = 0.9
    hyp = Hypothesis(tokens=tokens, score=-1.0, logprob=-1.0, attention=attention, finished=True)
    nothing = [(None, None)]  # nothing re-read: no copy shares, no heads
    monkeypatch.setattr(
        translator, "_search", lambda rows, **_: ([[hyp] for _ in rows], nothing * len(rows))
    )
    (t,) = translator.translate([source])
    assert t.text == expected
    assert t.tokens[len(head_ids)] == tok.tgt_pieces([UNK_ID])[0]  # the pieces stay the model's


def test_attention_rows_are_distributions_over_the_source_pieces(translator, sentences):
    out = translator.translate(sentences[:3], beam=3)
    assert any(t.finished for t in out)  # the overfitted model ends its sentences
    for t in out:
        assert t.attention.shape == (len(t.tgt_labels), len(t.src_tokens))
        assert torch.allclose(t.attention.sum(1), torch.ones(len(t.tgt_labels)), atol=1e-5)
        assert (t.tgt_labels[-1] == EOS_PIECE) == t.finished
        assert EOS_PIECE not in t.tgt_labels[:-1]


def test_attention_as_text_has_source_across_and_target_down(translator):
    (t,) = translator.translate(["A dog runs in the park."], beam=2)
    lines = format_attention(t).splitlines()
    assert lines[0].split() == t.src_tokens
    assert [line.split()[0] for line in lines[1:]] == t.tgt_labels
    for line, row in zip(lines[1:], t.attention.tolist(), strict=True):
        cells = line.split()[1:]
        assert len(cells) == len(t.src_tokens)
        best = max(range(len(row)), key=row.__getitem__)
        assert cells[best] == str(round(100 * row[best]))


def test_attention_plot_is_a_png(translator, tmp_path):
    import matplotlib.image

    (t,) = translator.translate(["Two dogs are playing in the snow."], beam=2)
    path = tmp_path / "att.png"
    plot_attention(t, path)
    assert path.read_bytes().startswith(PNG_MAGIC)
    image = matplotlib.image.imread(path)
    height, width, _ = image.shape
    assert height > 50 and width > 50
    # A heatmap, not an empty frame: dark cells (little weight) and light ones (much).
    grey = image[..., :3].mean(-1)
    assert (grey < 0.2).mean() > 0.05 and (grey > 0.8).mean() > 0.05
    # One cell a token: a longer sentence gives a wider picture.
    (longer,) = translator.translate(["Two dogs are playing in the snow near a big red house."])
    plot_attention(longer, tmp_path / "long.png")
    assert matplotlib.image.imread(tmp_path / "long.png").shape[1] > width


def test_plot_paths_number_inputs_when_there_are_several(tmp_path):
    assert plot_paths(tmp_path / "a.png", 1) == [tmp_path / "a.png"]
    assert plot_paths(tmp_path / "a.png", 2) == [tmp_path / "a-1.png", tmp_path / "a-2.png"]


def test_read_lines_splits_on_newlines_only(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes("one\r\ntwo\u2028still two\n\nfour\n".encode())
    assert read_lines(path) == ["one", "two\u2028still two", "", "four"]
    path.write_bytes(b"\xff\xfe bad")
    with pytest.raises(Exception, match="line 1 is not valid UTF-8"):
        read_lines(path)


def test_read_lines_stops_at_a_line_that_never_ends(tmp_path):
    """`/dev/zero` as --input or --src: one line without end, read until memory was full;
    now refused once a line passes MAX_LINE_BYTES, wherever it starts (lines before it, a
    read of a MiB ending inside it). A line of exactly the limit is read."""
    path = tmp_path / "in.txt"
    path.write_bytes(b"a dog\n" * 3 + b"x" * MAX_LINE_BYTES + b"\nlast")
    assert read_lines(path)[2:] == ["a dog", "x" * MAX_LINE_BYTES, "last"]
    path.write_bytes(b"a dog\n" * 3 + b"x" * (MAX_LINE_BYTES + 1) + b"\n")
    with pytest.raises(FileError, match=r"in.txt: line 4 is over 1,048,576 bytes"):
        read_lines(path)
    with pytest.raises(FileError, match=r"^/dev/zero: line 1 is over 1,048,576 bytes"):
        read_lines(Path("/dev/zero"))
    (tmp_path / "broken").symlink_to(tmp_path / "nowhere")
    with pytest.raises(FileError, match=r"broken: a broken link$"):
        read_lines(tmp_path / "broken")


# --------------------------------------------------------------------------- the command

runner = CliRunner()


def nmt(*args: str, input: str | None = None):
    return runner.invoke(app, list(args), input=input)


def test_cli_translates_arguments(tiny_run, translator, sentences):
    result = nmt("translate", "-m", str(tiny_run.run_dir), "--beam", "3", sentences[0], "")
    assert result.exit_code == 0, result.output
    expected = translator.translate([sentences[0]], beam=3)[0].text
    assert result.stdout.split("\n") == [expected, "", ""]


def test_cli_translates_stdin_line_by_line(tiny_run, translator, sentences):
    text = "\n".join([sentences[1], "", sentences[2]]) + "\n"
    result = nmt("translate", "-m", str(tiny_run.run_dir), input=text)
    assert result.exit_code == 0, result.output
    expected = [t.text for t in translator.translate([sentences[1], "", sentences[2]])]
    assert result.stdout.splitlines() == expected


def test_cli_translates_files(tiny_run, translator, sentences, tmp_path):
    src, out = tmp_path / "in.en", tmp_path / "out" / "hyp.fr"
    out.parent.mkdir()
    src.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    args = ["translate", "-m", str(tiny_run.checkpoint), "--input", str(src)]
    result = nmt(*args, "--output", str(out), "--beam", "2", "--batch-size", "3")
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    expected = [t.text for t in translator.translate(sentences, beam=2)]
    assert out.read_text(encoding="utf-8").splitlines() == expected


def test_cli_nbest_prints_numbered_hypotheses_with_scores(tiny_run, sentences):
    result = nmt(
        "translate", "-m", str(tiny_run.run_dir), "--beam", "3", "--nbest", "2", *sentences[:2]
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line.split(" ||| ")[0] for line in lines] == ["0", "0", "1", "1"]
    scores = [float(line.split(" ||| ")[2]) for line in lines]
    assert scores[0] >= scores[1] and scores[2] >= scores[3]


def test_cli_shows_attention_and_writes_one_png_per_sentence(tiny_run, sentences, tmp_path):
    plot = tmp_path / "att.png"
    args = ["translate", "-m", str(tiny_run.run_dir), "--show-attention"]
    result = nmt(*args, "--attention-plot", str(plot), sentences[0], sentences[1])
    assert result.exit_code == 0, result.output
    assert EOS_PIECE in result.stdout
    assert not plot.exists()
    for name in ("att-1.png", "att-2.png"):
        assert (tmp_path / name).read_bytes().startswith(PNG_MAGIC)
    result = nmt("translate", "-m", str(tiny_run.run_dir), "--attention-plot", str(plot), "A dog.")
    assert result.exit_code == 0, result.output
    assert plot.read_bytes().startswith(PNG_MAGIC)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--input", "in.txt", "A dog."], "not both"),
        (["--input", "missing.txt"], "missing.txt: no such file"),
        (["--beam", "0", "A dog."], "--beam 0"),
        (["--device", "tpu", "A dog."], "--device 'tpu'"),
        (["--attention-plot", "att.jpg", "A dog."], "ending .png"),
        # on the CPU: --device auto takes a GPU where there is one, and there fp16 runs
        (["--device", "cpu", "--precision", "fp16", "A dog."], "--precision: fp16 needs a GPU"),
        (["--precision", "half", "A dog."], "--precision 'half'"),
    ],
)
def test_cli_user_errors_are_one_line_and_exit_2(tiny_run, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.txt").write_text("A dog.\n", encoding="utf-8")
    result = nmt("translate", "-m", str(tiny_run.run_dir), *args)
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr


def test_cli_interactive_answers_each_line_before_the_next_is_typed(tiny_run, translator):
    """--interactive: one model load, then each line translated as soon as it arrives (the
    next one is written only after the answer came back), its time on stderr; EOF leaves."""
    inputs = ["A dog runs.", "", "Two girls play in the snow."]
    proc = subprocess.Popen(
        [sys.executable, "-m", "nmt", "translate", "--interactive", "-m", str(tiny_run.run_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    answers = []
    try:
        for line in inputs:
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
            answers.append(proc.stdout.readline().rstrip("\n"))
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
    assert answers == [t.text for t in translator.translate(inputs)]
    assert proc.stderr is not None
    times = [line for line in proc.stderr.read().splitlines() if line.endswith(" s)")]
    assert len(times) == len(inputs)


def test_cli_interactive_with_nbest_and_its_errors(tiny_run, sentences):
    args = ["translate", "-m", str(tiny_run.run_dir), "--interactive"]
    result = nmt(*args, "--beam", "3", "--nbest", "2", input=f"{sentences[0]}\n{sentences[1]}\n")
    assert result.exit_code == 0, result.output
    assert [line.split(" ||| ")[0] for line in result.stdout.splitlines()] == ["0", "0", "1", "1"]
    result = nmt(*args, "A dog.")
    assert result.exit_code == 2 and "--interactive reads stdin" in result.stderr
    # a line without end (`cat /dev/zero |`) stops at MAX_LINE_BYTES, after the lines before it
    result = nmt(*args, input=f"{sentences[0]}\n" + "x" * (MAX_LINE_BYTES + 1))
    assert result.exit_code == 2 and len(result.stdout.splitlines()) == 1
    assert "stdin: line 2 is over 1,048,576 bytes" in result.stderr
    result = nmt(*args, input=f"{sentences[0]}\n" + "x" * MAX_LINE_BYTES)  # the limit: read
    assert result.exit_code == 0 and len(result.stdout.splitlines()) == 2


def test_translating_imports_no_dataset_metric_or_plot_library(tiny_run):
    """The translate path stays light: start-up is torch plus the model, nothing else."""
    code = f"""
import sys
from typer.testing import CliRunner
from nmt.cli import app
result = CliRunner().invoke(app, ["translate", "-m", {str(tiny_run.run_dir)!r}, "A dog."])
assert result.exit_code == 0, result.output
libraries = ("datasets", "pyarrow", "pandas", "sacrebleu", "matplotlib")
heavy = [m for m in libraries if m in sys.modules]
assert not heavy, heavy
"""
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cli_progress_bar_stays_off_stdout(tiny_run, sentences):
    args = ["translate", "-m", str(tiny_run.run_dir), "--progress", "--batch-size", "2"]
    result = nmt(*args, *sentences)
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == len(sentences)


def test_cli_bf16_translates_too(tiny_run, sentences):
    args = ["translate", "-m", str(tiny_run.run_dir), "--precision", "bf16", "--beam", "2"]
    result = nmt(*args, *sentences[:3])
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 3


def test_cli_names_decoding_arguments_by_their_flags(tiny_run):
    result = nmt("translate", "-m", str(tiny_run.run_dir), "--beam", "3", "--nbest", "4", "A dog.")
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: --nbest 4: expected 1 to the beam size (3)"


def test_cli_without_a_trained_run_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = nmt("translate", "A dog.")
    assert result.exit_code == 2
    assert "no trained run found" in result.stderr


def test_import_nmt_and_help_stay_light():
    code = (
        "import sys, nmt, nmt.cli; "
        "assert 'torch' not in sys.modules and 'datasets' not in sys.modules, 'heavy import'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    help_text = subprocess.run(
        [sys.executable, "-m", "nmt", "--help"], check=True, capture_output=True, text=True
    ).stdout
    assert "translate" in help_text and "eval" in help_text


def test_translator_is_exported_lazily():
    import nmt

    assert nmt.Translator is Translator
    with pytest.raises(AttributeError):
        _ = nmt.NoSuchThing  # type: ignore[attr-defined]
