"""scripts/repeats.py: length against the references, repeated n-grams, runaway sentences."""

from __future__ import annotations

import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))

import repeats  # noqa: E402


def test_repeats_finds_an_ngram_twice_only():
    assert repeats.repeats(["un", "chien", "un", "chien", "court"], 2)
    assert not repeats.repeats(["un", "chien", "un", "chat", "court"], 2)
    assert not repeats.repeats(["a", "b"], 3)  # shorter than one n-gram
    assert repeats.repeats(["a", "a"], 1)


def test_counts_of_a_hand_made_file(tmp_path, capsys):
    refs = ["un chien court", "deux chats dorment sur le lit", "une femme"]
    hyps = [
        "un chien court dans le parc dans le parc",  # 9 words for 3: runaway (> 6.5), repeats
        "deux chats dorment",  # 3 for 6: short
        "une femme",
    ]
    (tmp_path / "ref").write_text("\n".join(refs) + "\n")
    (tmp_path / "hyp").write_text("\n".join(hyps) + "\n")
    repeats.main([str(tmp_path / "hyp"), "--ref", str(tmp_path / "ref")])
    # 14 words for 11; "dans le parc" twice; 9 > 1.5 x 3 + 2; 6 words beyond the first reference
    assert capsys.readouterr().out.strip() == (
        f"{tmp_path / 'hyp'}: length ratio 1.273 (14 words for 11); 1 of 3 sentences repeat a "
        "3-gram; 1 over 1.5 x their reference + 2 words; 6 words beyond the references' lengths"
    )


def test_order_and_runaway_are_the_callers(tmp_path, capsys):
    (tmp_path / "ref").write_text("a b c d\n")
    (tmp_path / "hyp").write_text("a b a c d e f\n")  # "a" twice; 7 words for 4
    repeats.main([str(tmp_path / "hyp"), "--ref", str(tmp_path / "ref"), "--order", "1"])
    assert "1 of 1 sentences repeat a 1-gram; 0 over 1.5 x" in capsys.readouterr().out
    repeats.main(
        [str(tmp_path / "hyp"), "--ref", str(tmp_path / "ref"), "--order", "2", "--runaway", "1"]
    )
    assert "0 of 1 sentences repeat a 2-gram; 1 over 1 x" in capsys.readouterr().out


@pytest.mark.parametrize(
    "hyp, ref, says",
    [
        ("a\nb\n", "a\n", "has 2 lines but --ref"),
        (None, "a\n", "no such file"),
        ("a\n", "\n", "no words"),
        (b"\xff\n", "a\n", "not valid UTF-8"),
    ],
    ids=["misaligned", "missing", "empty-ref", "not-utf8"],
)
def test_bad_input_is_one_line(tmp_path, hyp, ref, says):
    (tmp_path / "ref").write_text(ref)
    if isinstance(hyp, bytes):
        (tmp_path / "hyp").write_bytes(hyp)
    elif hyp is not None:
        (tmp_path / "hyp").write_text(hyp)
    with pytest.raises(SystemExit) as e:
        repeats.main([str(tmp_path / "hyp"), "--ref", str(tmp_path / "ref")])
    assert says in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("flag", [["--order", "0"], ["--runaway", "0"], ["--runaway", "nan"]])
def test_a_bad_flag_is_a_usage_error(tmp_path, flag):
    (tmp_path / "f").write_text("a\n")
    with pytest.raises(SystemExit) as e:
        repeats.main([str(tmp_path / "f"), "--ref", str(tmp_path / "f"), *flag])
    assert e.value.code == 2


def test_an_order_far_beyond_any_sentence_finds_no_repeat_at_once(tmp_path, capsys):
    """The n-grams are cut a window at a time: a huge --order costs nothing."""
    assert not repeats.repeats(["a", "a", "a"], 10**20)
    (tmp_path / "f").write_text("a a a a\n")
    repeats.main([str(tmp_path / "f"), "--ref", str(tmp_path / "f"), "--order", str(10**20)])
    assert "0 of 1 sentences repeat" in capsys.readouterr().out
