"""scripts/checkpoint_repeats.py: kept checkpoints of nmt and OpenNMT-py decoded greedily and
read side by side, with a stand-in for OpenNMT-py's `onmt_translate`."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from conftest import ROOT, TINY_DATA

from nmt import Translator, evaluate
from nmt.files import read_lines
from nmt.tokenizer import JOINT_FILE

sys.path.insert(0, str(ROOT / "scripts"))

import checkpoint_repeats  # noqa: E402
import repeats  # noqa: E402

# What stands in for onmt_translate: refuses anything but greedy search, and writes in
# sentencepiece's pieces (WORK's model) each reference sentence of --data's val.fr, the
# first one written twice over (a repeat, and a runaway sentence), the second with its last
# three words again (a repeat only).
FAKE_ONMT = f"""#!{sys.executable}
import sys
import sentencepiece as spm
args = sys.argv[1:]
opts = dict(zip(args[::2], args[1::2]))
assert opts["-beam_size"] == "1" and opts["-max_length"] == "100", args
work = sys.argv[0].removesuffix("/venv-onmt/bin/onmt_translate")
sp = spm.SentencePieceProcessor(model_file=work + "/spm-run/spm.model")
refs = open({str(TINY_DATA / "val.fr")!r}, encoding="utf-8").read().splitlines()
refs[0] = refs[0] + " " + refs[0]
refs[1] = refs[1] + " " + " ".join(refs[1].split()[-3:])
with open(opts["-output"], "w", encoding="utf-8") as f:
    for ref in refs:
        f.write(" ".join(sp.encode(ref, out_type=str)) + "\\n")
"""


def _work(tmp_path: Path, tiny_run, onmt_steps=(10,), nmt_steps=(10, 20)) -> Path:
    """A compare_peers.py --work folder: nmt-fp32 kept step-N.pt for `nmt_steps` (the tiny
    model each time), OpenNMT-py saved model_step_N.pt for `onmt_steps`."""
    work = tmp_path / "work"
    run = work / "nmt-fp32"
    run.mkdir(parents=True)
    for n in nmt_steps:
        shutil.copy(tiny_run.checkpoint, run / f"step-{n}.pt")
    (run / "last.pt").write_bytes(b"")  # not a step checkpoint
    (run / "step-x.pt").write_bytes(b"")  # nor this
    (work / "onmt-run").mkdir()
    for n in onmt_steps:
        (work / "onmt-run" / f"model_step_{n}.pt").write_bytes(b"")
    bin_dir = work / "venv-onmt" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "onmt_translate").write_text(FAKE_ONMT)
    (bin_dir / "onmt_translate").chmod(0o755)
    (work / "spm-run").mkdir()
    shutil.copy(tiny_run.run_dir / JOINT_FILE, work / "spm-run" / "spm.model")
    (work / "pieces").mkdir()
    shutil.copy(TINY_DATA / "val.en", work / "pieces" / "val.en")
    return work


def test_each_kept_checkpoint_decoded_and_read_side_by_side(tmp_path, tiny_run, capsys):
    work = _work(tmp_path, tiny_run)
    keep = tmp_path / "hyps"
    checkpoint_repeats.main(["--work", str(work), "--data", str(TINY_DATA), "--keep", str(keep)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "| model | 10 | 20 |"
    refs = read_lines(TINY_DATA / "val.fr")
    again = " ".join(refs[1].split()[-3:])
    onmt = [f"{refs[0]} {refs[0]}", f"{refs[1]} {again}", *refs[2:]]  # the stand-in's, joined
    assert read_lines(keep / "OpenNMT-py.step-10.fr") == onmt
    c = repeats.count(onmt, refs, 3, 1.5)
    assert c.repeating == repeats.count(refs, refs, 3, 1.5).repeating + 2 and c.runaway == 1
    score = evaluate.bleu(onmt, refs).score
    # it saved no checkpoint at update 20: an empty cell
    assert lines[4] == f"| OpenNMT-py | {score:.1f}; {c.ratio:.3f}; {c.repeating}; 1 |  |"
    # nmt's cells are its greedy output, as Translator gives it, counted the same way
    val = read_lines(TINY_DATA / "val.en")
    hyps = [t.text for t in Translator.from_checkpoint(tiny_run.checkpoint).translate(val, beam=1)]
    assert read_lines(keep / "nmt-fp32.step-10.fr") == hyps
    nmt = checkpoint_repeats.cell(
        hyps,
        refs,
        checkpoint_repeats.arguments(["--work", str(work), "--data", str(TINY_DATA)]),
    )
    assert lines[5] == f"| nmt-fp32 | {nmt} | {nmt} |"
    assert sorted(p.name for p in keep.iterdir()) == [
        "OpenNMT-py.step-10.fr",
        "nmt-fp32.step-10.fr",
        "nmt-fp32.step-20.fr",
    ]


def test_steps_asked_for_and_another_nmt_run(tmp_path, tiny_run, capsys):
    work = _work(tmp_path, tiny_run, onmt_steps=(10, 30), nmt_steps=(20,))
    other = tmp_path / "elsewhere" / "feed1"
    other.mkdir(parents=True)
    shutil.copy(tiny_run.checkpoint, other / "step-30.pt")
    checkpoint_repeats.main(
        ["--work", str(work), "--data", str(TINY_DATA), "--nmt", str(other), "--steps", "30"]
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "| model | 30 |"
    assert [line.split(" | ")[0] for line in lines[4:]] == ["| OpenNMT-py", "| nmt-fp32", "| feed1"]
    assert lines[5] == "| nmt-fp32 |  |"  # nothing kept at update 30
    assert lines[4] != "| OpenNMT-py |  |" and lines[6] != "| feed1 |  |"


@pytest.mark.parametrize(
    ("spoil", "says"),
    [
        (lambda w: shutil.rmtree(w / "venv-onmt"), "onmt_translate"),
        (lambda w: (w / "pieces" / "val.en").unlink(), "expected a compare_peers.py --work"),
        (lambda w: (w / "spm-run" / "spm.model").write_text("junk"), "not a sentencepiece"),
        (lambda w: [p.unlink() for p in (w / "nmt-fp32").glob("step-*.pt")], "no step-N.pt"),
    ],
    ids=["no-onmt", "no-pieces", "damaged-spm", "no-checkpoints"],
)
def test_what_cannot_be_decoded_is_one_line(tmp_path, tiny_run, spoil, says):
    work = _work(tmp_path, tiny_run)
    spoil(work)
    keep = tmp_path / "hyps"
    with pytest.raises(SystemExit) as e:
        checkpoint_repeats.main(
            ["--work", str(work), "--data", str(TINY_DATA), "--keep", str(keep)]
        )
    assert str(e.value).startswith("error: ") and says in str(e.value)
    assert "\n" not in str(e.value)
    assert not keep.exists()  # said before anything was made: the same command runs again


def test_an_existing_keep_folder_is_refused_untouched(tmp_path, tiny_run, capsys):
    work = _work(tmp_path, tiny_run)
    keep = tmp_path / "mine"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit) as e:
        checkpoint_repeats.main(
            ["--work", str(work), "--data", str(TINY_DATA), "--keep", str(keep)]
        )
    assert e.value.code == 2 and "already exists" in capsys.readouterr().err
    assert [p.name for p in keep.iterdir()] == ["notes.txt"]


def test_opennmt_py_alone_needs_the_steps_named(tmp_path, tiny_run, capsys):
    work = _work(tmp_path, tiny_run, onmt_steps=(10, 20))
    shutil.rmtree(work / "nmt-fp32")
    with pytest.raises(SystemExit) as e:
        checkpoint_repeats.main(["--work", str(work), "--data", str(TINY_DATA)])
    assert "no nmt run kept a step-N.pt checkpoint; give --steps" in str(e.value)
    checkpoint_repeats.main(["--work", str(work), "--data", str(TINY_DATA), "--steps", "20"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "| model | 20 |" and lines[4].startswith("| OpenNMT-py | ")
    assert len(lines) == 5


def test_steps_no_model_kept_and_a_dangling_keep_link_are_one_line(tmp_path, tiny_run, capsys):
    work = _work(tmp_path, tiny_run)
    keep = tmp_path / "hyps"
    with pytest.raises(SystemExit) as e:
        checkpoint_repeats.main(
            ["--work", str(work), "--data", str(TINY_DATA), "--steps", "7", "--keep", str(keep)]
        )
    assert "no model kept a checkpoint at update 7" in str(e.value) and not keep.exists()
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")  # the user's link, dangling: not replaced
    with pytest.raises(SystemExit) as e:
        checkpoint_repeats.main(
            ["--work", str(work), "--data", str(TINY_DATA), "--keep", str(link)]
        )
    assert e.value.code == 2 and "already exists" in capsys.readouterr().err
    assert link.is_symlink() and not (tmp_path / "nowhere").exists()
