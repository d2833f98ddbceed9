"""Tokenizer: training on the tiny corpus, fixed special ids, joint/separate, persistence."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from nmt.config import TokenizerConfig
from nmt.tokenizer import (
    BOS_ID,
    EOS_ID,
    JOINT_FILE,
    PAD_ID,
    SETTINGS_FILE,
    SRC_FILE,
    TGT_FILE,
    UNK_ID,
    Tokenizer,
    TokenizerError,
    train_or_load,
)

TINY = Path(__file__).parent / "data" / "tiny"
EN = (TINY / "train.en").read_text(encoding="utf-8").splitlines()
FR = (TINY / "train.fr").read_text(encoding="utf-8").splitlines()
CFG = TokenizerConfig(vocab_size=200)


def quiet(_: str) -> None:
    pass


@pytest.fixture(scope="module")
def joint(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return Tokenizer.train(EN, FR, CFG, tmp_path_factory.mktemp("joint"), log=quiet)


@pytest.fixture(scope="module")
def separate(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    cfg = TokenizerConfig(vocab_size=200, joint=False)
    return Tokenizer.train(EN, FR, cfg, tmp_path_factory.mktemp("separate"), log=quiet)


def test_round_trip_gives_the_sentences_back(joint: Tokenizer, separate: Tokenizer) -> None:
    for tok in (joint, separate):
        assert tok.decode_tgt(tok.encode_tgt(FR)) == FR
        # the source side has no decode: its pieces must spell the sentence
        assert "".join(tok.src_pieces(EN[0])).replace("\u2581", " ").strip() == EN[0]


def test_one_call_gives_ids_pieces_and_surfaces(joint: Tokenizer, separate: Tokenizer) -> None:
    sentences = [*EN[:5], "Z\u00fcrich \U0001f415 caf\u00e9", ""]
    for tok in (joint, separate):
        found = tok.encode_src_pieces(sentences)
        assert [f.ids for f in found] == tok.encode_src(sentences)
        assert [f.pieces for f in found] == [tok.src_pieces(s) for s in sentences]
        for f, s in zip(found, sentences, strict=True):
            assert "".join(f.surfaces) == s  # the pieces cover the text, nothing lost
        cut = found[5].cut(3)
        assert (cut.ids, cut.pieces, cut.surfaces) == (
            found[5].ids[:3],
            found[5].pieces[:3],
            found[5].surfaces[:3],
        )
        # read lazily from sentencepiece's proto, which does not pickle: pickled as read out
        again = pickle.loads(pickle.dumps(cut))
        assert (again.ids, again.pieces, again.surfaces) == (cut.ids, cut.pieces, cut.surfaces)


def test_special_ids_are_fixed_and_never_produced_by_encoding(joint: Tokenizer) -> None:
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    assert joint.tgt_pieces([PAD_ID, UNK_ID, BOS_ID, EOS_ID]) == ["<pad>", "<unk>", "<s>", "</s>"]
    ids = {i for row in joint.encode_src(EN) + joint.encode_tgt(FR) for i in row}
    assert not ids & {PAD_ID, BOS_ID, EOS_ID, UNK_ID}
    # an unseen character is the unknown piece, not an error
    assert UNK_ID in joint.encode_src(["\u4e2d"])[0]


def test_decode_skips_pad_bos_eos(joint: Tokenizer) -> None:
    (ids,) = joint.encode_tgt([FR[0]])
    assert joint.decode_tgt([[BOS_ID, *ids, EOS_ID, PAD_ID, PAD_ID]]) == [FR[0]]


def test_joint_shares_one_model_and_separate_keeps_two(
    joint: Tokenizer, separate: Tokenizer
) -> None:
    assert joint.joint and set(joint.to_bytes()) == {"joint"}
    assert joint.encode_src([FR[0]]) == joint.encode_tgt([FR[0]])
    assert not separate.joint and set(separate.to_bytes()) == {"src", "tgt"}
    # a French word is one piece of the French model but not of the English one
    assert separate.tgt_pieces(separate.encode_tgt(["chien"])[0]) == ["\u2581chien"]
    assert separate.src_pieces("chien") != ["\u2581chien"]


def test_files_written_for_each_layout(tmp_path: Path) -> None:
    Tokenizer.train(EN, FR, CFG, tmp_path / "j", log=quiet)
    Tokenizer.train(EN, FR, TokenizerConfig(vocab_size=100, joint=False), tmp_path / "s", log=quiet)
    assert (tmp_path / "j" / JOINT_FILE).is_file()
    assert not (tmp_path / "j" / SRC_FILE).exists()
    assert (tmp_path / "s" / SRC_FILE).is_file() and (tmp_path / "s" / TGT_FILE).is_file()


def test_load_and_bytes_give_identical_encodings(tmp_path: Path) -> None:
    for joint in (True, False):
        out = tmp_path / str(joint)
        tok = Tokenizer.train(EN, FR, TokenizerConfig(vocab_size=150, joint=joint), out, log=quiet)
        for other in (Tokenizer.load(out), Tokenizer.from_bytes(tok.to_bytes())):
            assert other.joint == joint
            assert other.encode_src(EN) == tok.encode_src(EN)
            assert other.encode_tgt(FR) == tok.encode_tgt(FR)
            assert (other.src_vocab_size, other.tgt_vocab_size) == (
                tok.src_vocab_size,
                tok.tgt_vocab_size,
            )


TRAIN_IN_A_PROCESS = """
import hashlib, sys
from pathlib import Path
from nmt.config import TokenizerConfig
from nmt.tokenizer import Tokenizer
tiny = Path(sys.argv[1])
en = (tiny / "train.en").read_text(encoding="utf-8").splitlines() * 3
fr = (tiny / "train.fr").read_text(encoding="utf-8").splitlines() * 3
cfg = TokenizerConfig(vocab_size=150, input_sentence_size=150)
tok = Tokenizer.train(iter(en), iter(fr), cfg, Path(sys.argv[2]), log=lambda _: None)
print(hashlib.sha256(tok.to_bytes()["joint"]).hexdigest())
"""


def test_training_is_deterministic(tmp_path: Path) -> None:
    # Separate processes, since sentencepiece's own sampler differs between processes;
    # 288 sentences of which 150 are sampled make the sample matter.
    digests = {
        subprocess.run(
            [sys.executable, "-c", TRAIN_IN_A_PROCESS, str(TINY), str(tmp_path / str(i))],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        for i in range(2)
    }
    assert len(digests) == 1


def test_a_vocabulary_larger_than_the_corpus_supports_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError) as info:
        Tokenizer.train(EN, FR, TokenizerConfig(vocab_size=5000), tmp_path, log=quiet)
    message = str(info.value)
    assert message.startswith("tokenizer.vocab_size 5000: the train split supports at most")
    most = int(message.split("at most ")[1].split()[0])
    assert not list(tmp_path.iterdir())  # nothing written
    tok = Tokenizer.train(EN, FR, TokenizerConfig(vocab_size=most), tmp_path, log=quiet)
    assert tok.src_vocab_size == most  # the size it names works


def test_empty_corpus_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="train split has no text"):
        Tokenizer.train(["", ""], [""], CFG, tmp_path, log=quiet)


def test_train_or_load_trains_once_then_reuses(tmp_path: Path) -> None:
    lines: list[str] = []
    first = train_or_load(CFG, tmp_path, EN, FR, log=lines.append)

    def no_text():  # the iterables must not even be read when reusing
        raise AssertionError("read the corpus although a tokenizer was there")
        yield ""

    second = train_or_load(CFG, tmp_path, no_text(), no_text(), log=lines.append)
    assert second.to_bytes() == first.to_bytes()
    assert lines[0].startswith("tokenizer: trained") and lines[1].startswith("tokenizer: reusing")


def test_train_or_load_refuses_models_trained_with_other_settings(tmp_path: Path) -> None:
    train_or_load(CFG, tmp_path, EN, FR, log=quiet)
    with pytest.raises(TokenizerError, match="vocab_size=200"):
        train_or_load(TokenizerConfig(vocab_size=300), tmp_path, EN, FR, log=quiet)


@pytest.mark.parametrize(
    "content, says",
    [
        (b'{"type": "unigram", ', "Expecting property name"),  # cut short
        (b"[1]", "not a mapping of settings"),
        (b"\xff\xfe", "can't decode byte 0xff"),
        (b"[" * 100_000, "recursion"),
        (b'{"vocab_size": ' + b"9" * 5000 + b"}", "Exceeds the limit"),
    ],
    ids=["cut short", "a list", "not UTF-8", "nested", "a huge number"],
)
def test_train_or_load_refuses_damaged_settings_in_one_line(tmp_path: Path, content, says):
    train_or_load(CFG, tmp_path, EN, FR, log=quiet)
    (tmp_path / SETTINGS_FILE).write_bytes(content)
    with pytest.raises(TokenizerError) as info:
        train_or_load(CFG, tmp_path, EN, FR, log=quiet)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / SETTINGS_FILE}: not the tokenizer settings nmt writes")
    assert says in message and message.endswith(f"delete {tmp_path}/spm.*")
    assert "\n" not in message and len(message) < 600


def test_bad_models_are_rejected_with_a_message(tmp_path: Path, joint: Tokenizer) -> None:
    with pytest.raises(TokenizerError, match="expected keys"):
        Tokenizer.from_bytes({"src": joint.to_bytes()["joint"]})
    with pytest.raises(TokenizerError, match="not a sentencepiece model"):
        Tokenizer.from_bytes({"joint": b"not a model"})
    with pytest.raises(TokenizerError, match="no tokenizer found"):
        Tokenizer.load(tmp_path)


def test_train_or_load_says_a_folder_in_the_settings_place(tmp_path: Path):
    """A folder where spm.json belongs was skipped in silence: the models were reused with
    settings nobody could check. It is said in one line, and left as it was."""
    train_or_load(CFG, tmp_path, EN, FR, log=quiet)
    (tmp_path / SETTINGS_FILE).unlink()
    (tmp_path / SETTINGS_FILE).mkdir()
    with pytest.raises(TokenizerError) as info:
        train_or_load(CFG, tmp_path, EN, FR, log=quiet)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / SETTINGS_FILE}: not the tokenizer settings nmt writes")
    assert "Is a directory" in message and "\n" not in message
    assert (tmp_path / SETTINGS_FILE).is_dir()


@pytest.mark.parametrize("make", ["fifo", "broken link"])
def test_train_or_load_says_a_pipe_or_a_broken_link_in_the_settings_place(tmp_path: Path, make):
    """Neither is read (a pipe would block nmt for ever) nor skipped: one line, left as it was."""
    train_or_load(CFG, tmp_path, EN, FR, log=quiet)
    settings = tmp_path / SETTINGS_FILE
    settings.unlink()
    if make == "fifo":
        os.mkfifo(settings)
    else:
        settings.symlink_to(tmp_path / "gone.json")
    with pytest.raises(TokenizerError) as info:
        train_or_load(CFG, tmp_path, EN, FR, log=quiet)
    message = str(info.value)
    assert message.startswith(f"{settings}: not the tokenizer settings nmt writes")
    assert "not a regular file" in message and "\n" not in message
    assert os.path.lexists(settings) and not settings.is_file()
