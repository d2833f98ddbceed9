"""Checkpoints (`nmt.checkpoint`) and the run directory that keeps them (`nmt.run_dir`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from nmt.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from nmt.cli import app
from nmt.files import stands_in
from nmt.run_dir import OWNER_MARK, RunFiles


def test_step_checkpoints_keep_the_last_k(tmp_path):
    run = RunFiles(tmp_path / "run", keep_last=2)
    run.claim(resume=False, overwrite=False)
    for step in (1, 2, 3):
        run.save({"x": torch.tensor(step)}, step=step, best=step == 2)
    names = sorted(p.name for p in run.dir.iterdir())
    assert names == [OWNER_MARK, "best.pt", "last.pt", "step-2.pt", "step-3.pt"]
    assert load_checkpoint(run.dir / "best.pt")["x"].item() == 2
    assert load_checkpoint(run.dir / "last.pt")["x"].item() == 3


def test_a_kill_during_a_checkpoint_write_leaves_the_previous_one(tmp_path):
    path = tmp_path / "last.pt"
    save_checkpoint({"x": torch.tensor(1)}, path)
    child = textwrap.dedent(
        f"""
        import time, torch
        from pathlib import Path
        from nmt.checkpoint import save_checkpoint
        real = torch.save
        def slow_save(obj, f):
            f.write(b"partial bytes of a new checkpoint")
            f.flush()
            print("writing", flush=True)
            time.sleep(60)
        torch.save = slow_save
        save_checkpoint({{"x": torch.tensor(2)}}, Path({str(path)!r}))
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert load_checkpoint(path)["x"].item() == 1


@pytest.mark.parametrize("kind", ["a folder", "a pipe", "a broken link", "a socket", "a device"])
def test_what_stands_where_a_checkpoint_should_be_is_named_and_never_opened(tmp_path, kind):
    # It read "no such checkpoint file" for all of these, though something is there (`nmt
    # translate -m <(cat best.pt)` said its pipe did not exist). A pipe opened to be read
    # would block for ever: the suite's timeout would fail the test.
    path = tmp_path / "model.pt"
    if kind == "a folder":
        path.mkdir()
    elif kind == "a pipe":
        os.mkfifo(path)
    elif kind == "a broken link":
        path.symlink_to(tmp_path / "gone.pt")
    elif kind == "a socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
    else:
        path = Path(os.devnull)
    assert stands_in(path) == kind
    with pytest.raises(CheckpointError, match=f"^{path}: {kind}, not a checkpoint file: save"):
        load_checkpoint(path)
    assert stands_in(tmp_path / "none.pt") is None
    with pytest.raises(CheckpointError, match="none.pt: no such checkpoint file$"):
        load_checkpoint(tmp_path / "none.pt")
    save_checkpoint({"x": torch.tensor(1)}, tmp_path / "real.pt")
    (tmp_path / "link.pt").symlink_to(tmp_path / "real.pt")
    assert stands_in(tmp_path / "real.pt") is None and stands_in(tmp_path / "link.pt") is None


def test_translate_from_a_pipe_says_so_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.mkfifo("model.pt")
    result = CliRunner().invoke(app, ["translate", "-m", "model.pt", "A dog runs."])
    assert result.exit_code == 2
    assert (
        result.stderr == "error: model.pt: a pipe, not a checkpoint file: save the "
        "checkpoint to a file and give that\n"
    )


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda p: p.symlink_to(p.parent / "gone.pt"), "a broken link, not a checkpoint file"),
        (lambda p: p.symlink_to(p), "unreadable (Too many levels of symbolic links)"),
        (lambda p: None, "no such run directory or checkpoint file"),
    ],
)
def test_a_link_that_leads_nowhere_is_named_as_a_link(tmp_path, monkeypatch, make, says):
    # `resolve_checkpoint` said "no such run directory or checkpoint file" for a link of the
    # user's that is there but leads nowhere (a mount gone, a loop).
    monkeypatch.chdir(tmp_path)
    make(tmp_path / "model.pt")
    result = CliRunner().invoke(app, ["translate", "-m", "model.pt", "A dog runs."])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: model.pt: ") and says in result.stderr
