"""scripts/ab_decode.py: two revisions' decoding measured in turn, in fresh processes."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT, TinyRun

SCRIPT = ROOT / "scripts" / "ab_decode.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs the repository's git history")
def test_two_revisions_decode_in_turn_and_their_outputs_compare(tiny_run: TinyRun, tmp_path):
    src = tmp_path / "src.txt"
    src.write_text("\n".join(tiny_run.train_src[:6]) + "\n", encoding="utf-8")
    done = _run("HEAD", ".", str(tiny_run.checkpoint), "--src", str(src), "--pairs", "2",
                "--calls", "1", "--threads", "1")  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].startswith("pair 1: HEAD ") and lines[2].startswith("pair 2: HEAD ")
    # the committed tree and this checkout decode the tiny model alike, as they should
    assert lines[-1].startswith("median of pairs: HEAD ") and lines[-1].endswith("the same output")
    listed = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True)
    assert b"ab_decode_" not in listed.stdout  # its worktree removed


def test_an_unknown_revision_is_one_line_and_no_traceback(tiny_run: TinyRun, tmp_path):
    src = tmp_path / "src.txt"
    src.write_text("a\n", encoding="utf-8")
    done = _run("no-such-revision-x", ".", str(tiny_run.checkpoint), "--src", str(src))
    assert done.returncode != 0
    assert done.stderr.strip().startswith("ab_decode.py: git rev-parse")
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_bad_source_file_or_checkpoint_is_one_line_before_any_decoding(tiny_run, tmp_path):
    bad, good, blank = tmp_path / "bad.en", tmp_path / "good.en", tmp_path / "blank.en"
    bad.write_bytes(b"\xff\n")
    good.write_text("a dog\n", encoding="utf-8")
    blank.write_text("\n  \n", encoding="utf-8")  # nothing to time: no 0.000 s figures
    cases = [
        ([str(tiny_run.checkpoint), "--src", str(bad)], "line 1 is not valid UTF-8"),
        ([str(tiny_run.checkpoint), "--src", str(blank)], "no sentence to decode"),
        ([str(tmp_path / "none.pt"), "--src", str(good)], "no such run directory or checkpoint"),
    ]
    for args, says in cases:
        done = _run(".", ".", *args)
        assert done.returncode != 0 and done.stderr.startswith("error: ") and says in done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
        assert done.stdout == ""  # refused before the first process ran


def test_from_text_times_the_lines_as_read(tiny_run: TinyRun, tmp_path):
    src = tmp_path / "src.txt"
    src.write_text("\n".join(tiny_run.train_src[:6]) + "\n", encoding="utf-8")
    done = _run(".", ".", str(tiny_run.checkpoint), "--src", str(src), "--pairs", "1",
                "--calls", "1", "--threads", "1", "--from-text")  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("src.txt (text), fp32, beam 1")
    assert lines[-1].endswith("the same output")
