"""The command line through Typer's CliRunner: help, exit codes, one-line errors."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import typer.rich_utils
from typer.testing import CliRunner

from nmt.cli import app
from nmt.cli_shared import help_text
from nmt.config import DATA_DIR_ENV

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"
TINY_DATA = ROOT / "tests" / "data" / "tiny"
COMMANDS = ["check-config", "prepare", "train", "translate", "eval"]

runner = CliRunner()


def assert_one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines and all(line.startswith("error: ") for line in lines), result.stderr
    for needle in needles:
        assert needle in result.stderr


def test_top_level_help_lists_every_command():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in COMMANDS:
        assert command in result.output


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_an_example(command):
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == 0
    assert "Example" in result.output


HELPS = {
    c.name or typer.main.get_command_name(c.callback.__name__): c.callback.__doc__
    for c in app.registered_commands
    if c.callback
}


@pytest.mark.parametrize("command", HELPS)
def test_help_prose_wraps_at_the_terminals_width_and_each_example_stays_whole(command, monkeypatch):
    # typer prints a docstring's line breaks as written: at 80 columns a sentence wrapped at
    # 100 came out cut in two (`--resume` alone on a line of `nmt train --help`).
    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", None)  # a user's TERMINAL_WIDTH
    wide, narrow = (
        [
            line.strip()
            for line in runner.invoke(app, [command, "--help"], env=env).output.splitlines()
        ]
        for env in ({"COLUMNS": "400"}, {"COLUMNS": "80"})
    )
    prose = examples = 0
    for paragraph in help_text(HELPS[command]).split("\n\n")[1:]:
        for line in paragraph.splitlines():
            if line.startswith(" "):  # a command to type: whole on a line at 80 columns
                assert line.strip() in narrow, f"{command} --help cuts {line.strip()!r}"
                examples += 1
            else:  # prose: one line where the terminal is wide enough
                assert line in wide, f"{command} --help breaks {line!r}"
                prose += 1
    assert prose and examples


def test_python_dash_m_runs_the_same_app():
    out = subprocess.run(
        [sys.executable, "-m", "nmt", "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and "check-config" in out.stdout


def test_check_config_prints_the_resolved_config():
    result = runner.invoke(app, ["check-config", str(TINY), "--set", "model.attention=general"])
    assert result.exit_code == 0, result.output
    assert "attention: bilinear" in result.stdout
    assert "max_len_ratio:" in result.stdout  # defaults are filled in


def test_check_config_reports_every_problem_with_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  atention: dot\n  dropout: 2\ntrain:\n  lr: fast\n")
    result = runner.invoke(app, ["check-config", str(bad)])
    assert_one_line_error(result, "model.atention", "did you mean 'attention'", "model.dropout")
    assert "train.lr: expected a number, got 'fast'" in result.stderr
    assert len(result.stderr.splitlines()) == 3


def test_bad_override_and_missing_config_exit_2(tmp_path):
    assert_one_line_error(
        runner.invoke(app, ["check-config", str(TINY), "--set", "train.max_steps=many"]),
        "train.max_steps",
    )
    assert_one_line_error(runner.invoke(app, ["check-config", "nope.yaml"]), "nope.yaml")


def test_prepare_reports_kept_pairs_and_padding(tmp_path):
    result = runner.invoke(
        app,
        ["prepare", str(TINY), "--set", f"data.dir={TINY_DATA}", "--set", f"run.dir={tmp_path}/r"],
    )
    assert result.exit_code == 0, result.output
    assert "48 kept" in result.stdout
    assert "padding" in result.stdout


def test_train_takes_on_what_prepare_made_and_prepare_refuses_what_it_did_not(tmp_path):
    run = tmp_path / "r"
    sets = ["--set", f"data.dir={TINY_DATA}", "--set", f"run.dir={run}"]
    assert runner.invoke(app, ["prepare", str(TINY), *sets]).exit_code == 0
    tokenizer = (run / "spm.model").read_bytes()
    result = runner.invoke(app, ["train", str(TINY), *sets, "--set", "train.max_steps=2"])
    assert result.exit_code == 0, result.output
    assert (run / "spm.model").read_bytes() == tokenizer  # reused, not trained again
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.yaml").write_text("my notes\n")  # named like a run's, not a run's
    other = ["--set", f"data.dir={TINY_DATA}", "--set", f"run.dir={mine}"]
    assert_one_line_error(runner.invoke(app, ["prepare", str(TINY), *other]), "config.yaml")
    assert sorted(p.name for p in mine.iterdir()) == ["config.yaml"]


def test_prepare_with_misaligned_data_is_a_one_line_error(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "val", "test"):
        (data / f"{split}.en").write_text("a\nb\nc\n")
        (data / f"{split}.fr").write_text("a\nb\nc\n")
    (data / "train.fr").write_text("a\nb\n")
    result = runner.invoke(
        app, ["prepare", str(TINY), "--set", f"data.dir={data}", "--set", f"run.dir={tmp_path}/r"]
    )
    assert_one_line_error(result, "train.en", "train.fr", "3", "2")


def test_train_then_refuse_to_clobber(tmp_path):
    args = [
        "train",
        str(TINY),
        "--set",
        f"data.dir={TINY_DATA}",
        "--set",
        f"run.dir={tmp_path}/run",
        "--set",
        "train.max_steps=3",
    ]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "stopped by max_steps at step 3" in first.stdout
    assert_one_line_error(runner.invoke(app, args), "--resume", "--overwrite")
    assert runner.invoke(app, [*args, "--overwrite"]).exit_code == 0
    assert_one_line_error(runner.invoke(app, [*args, "--resume", "--overwrite"]), "exclude")


# --------------------------------------------------------------------------- bad input
# Each case: one `error:` line on stderr naming the thing and what was expected, exit code 2,
# no traceback, and every file the user had is unchanged.


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _corpus(folder: Path, train_en: bytes = b"a b\nc d\n", train_fr: bytes = b"e f\ng h\n"):
    folder.mkdir()
    for split in ("val", "test"):  # not a training source: data.dedup would remove it there
        (folder / f"{split}.en").write_bytes(b"b a\n")
        (folder / f"{split}.fr").write_bytes(b"e f\n")
    (folder / "train.en").write_bytes(train_en)
    (folder / "train.fr").write_bytes(train_fr)
    return folder


def _train_args(data: Path | str, run: Path | str, *more: str) -> list[str]:
    return ["train", str(TINY), "--set", f"data.dir={data}", "--set", f"run.dir={run}", *more]


def _checkpoints(tmp_path: Path) -> dict[str, Path]:
    """A file that is not a checkpoint, a truncated one, and one of another format version."""
    import torch

    from nmt.checkpoint import save_checkpoint

    good = tmp_path / "good.pt"
    save_checkpoint({"x": torch.zeros(1000)}, good)
    out = {"not a checkpoint": tmp_path / "notes.pt", "truncated": tmp_path / "cut.pt"}
    out["not a checkpoint"].write_text("hello")
    out["truncated"].write_bytes(good.read_bytes()[:500])
    future = tmp_path / "future.pt"
    torch.save({"format": 99, "model": {}}, future)
    out["format 99"] = future
    return out


BAD_INPUT = {
    "yaml syntax": (
        lambda t: ["check-config", str(_write(t / "c.yaml", "model: [dot\n"))],
        ["c.yaml", "line 2, column 1", "invalid YAML"],
    ),
    "yaml not a mapping": (
        lambda t: ["check-config", str(_write(t / "c.yaml", "- a\n- b\n"))],
        ["c.yaml", "expected a mapping"],
    ),
    "unknown key": (
        lambda t: ["check-config", str(TINY), "--set", "train.lrr=1"],
        ["train.lrr: unknown key", "did you mean 'lr'"],
    ),
    "wrong type": (
        lambda t: ["check-config", str(TINY), "--set", "train.batch_size=big"],
        ["train.batch_size: expected an integer, got 'big'"],
    ),
    "invalid choice": (
        lambda t: ["check-config", str(TINY), "--set", "model.attention=cosine"],
        ["model.attention: 'cosine' is not allowed", "concat"],
    ),
    "zero size": (
        lambda t: ["check-config", str(TINY), "--set", "model.emb_size=0"],
        ["model.emb_size: 0 is below the minimum 1"],
    ),
    "negative size": (
        lambda t: ["check-config", str(TINY), "--set", "train.batch_size=-4"],
        ["train.batch_size: -4 is below the minimum 1"],
    ),
    "clip_norm 0": (
        lambda t: ["check-config", str(TINY), "--set", "train.clip_norm=0"],
        ["train.clip_norm: 0 must be above 0 (null turns it off)"],
    ),
    "missing config": (lambda t: ["train", str(t / "nope.yaml")], ["nope.yaml", "file not found"]),
    "a device as config": (
        lambda t: ["train", "/dev/zero"],
        ["/dev/zero: a device giving over 1,048,576 bytes, not a config file"],
    ),
    "malformed --set": (
        lambda t: ["check-config", str(TINY), "--set", "train.lr"],
        ["--set 'train.lr': expected KEY=VALUE"],
    ),
    "missing data dir": (
        lambda t: _train_args(t / "nowhere", t / "run"),
        ["nowhere/train.en: no such file"],
    ),
    "misaligned data": (
        lambda t: _train_args(_corpus(t / "d", train_fr=b"e f\n"), t / "run"),
        ["train.en has 2 lines but", "train.fr has 1"],
    ),
    "empty after filtering": (
        lambda t: _train_args(
            _corpus(t / "d"),
            t / "run",
            "--set",
            "data.max_len_ratio=1",
            "--set",
            "tokenizer.vocab_size=16",
            "--set",
            "data.max_len=1",
        ),
        ["the train split 'train' is empty after cleaning", "data.max_len"],
    ),
    "invalid utf-8": (
        lambda t: _train_args(_corpus(t / "d", train_en=b"a b\n\xff\n"), t / "run"),
        ["train.en: line 2 is not valid UTF-8"],
    ),
    "vocabulary too large": (
        lambda t: _train_args(TINY_DATA, t / "run", "--set", "tokenizer.vocab_size=50000"),
        ["tokenizer.vocab_size 50000: the train split supports at most"],
    ),
    "resume with nothing": (
        lambda t: [*_train_args(TINY_DATA, t / "run"), "--resume"],
        ["nothing to resume"],
    ),
    "no model": (lambda t: ["translate", "Hello."], ["no trained run found", "--model"]),
    "eval with no model": (lambda t: ["eval"], ["no trained run found"]),
}


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_is_one_line_exit_2_and_changes_nothing(tmp_path, case):
    make_args, needles = BAD_INPUT[case]
    args = make_args(tmp_path)
    before = _files(tmp_path)
    result = runner.invoke(app, args)
    assert_one_line_error(result, *needles)
    assert len(result.stderr.splitlines()) == 1, result.stderr
    after = _files(tmp_path)
    assert {k: v for k, v in after.items() if k in before} == before  # nothing of theirs changed


@pytest.mark.parametrize("kind", ["not a checkpoint", "truncated", "format 99"])
@pytest.mark.parametrize("command", ["translate", "eval"])
def test_a_bad_checkpoint_is_one_line_exit_2(tmp_path, kind, command):
    path = _checkpoints(tmp_path)[kind]
    before = path.read_bytes()
    args = [command, "--model", str(path)] + (["Hello."] if command == "translate" else [])
    result = runner.invoke(app, args)
    assert_one_line_error(result, str(path), {"format 99": "format 99"}.get(kind, "not"))
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    "output", ["/proc/no/such/dir/out.txt", "missing-dir/out.txt", "/proc/out.txt"]
)
def test_an_unwritable_output_is_refused_before_the_model_is_even_loaded(tmp_path, output):
    # The model does not exist: an error about --output proves it was checked first.
    for args in (
        ["translate", "Hello.", "--model", "no-model.pt", "--output", output],
        ["eval", "--model", "no-model.pt", "--output", output],
    ):
        result = runner.invoke(app, args)
        assert_one_line_error(result, f"--output {output}")


def test_debug_shows_the_traceback():
    plain = runner.invoke(app, ["translate", "Hello.", "--model", "no-model.pt"])
    assert "Traceback" not in plain.output
    debug = runner.invoke(app, ["--debug", "translate", "Hello.", "--model", "no-model.pt"])
    assert debug.exit_code == 2 and "Traceback" in debug.stderr


def test_a_test_that_leaves_a_signal_handler_fails_and_the_next_runs_without_it(tmp_path):
    """conftest fails a test that leaves its own SIGTERM handler in the suite's process (one
    left by a test of compare_peers.main made a later test's workers hang in CI)."""
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path)
    (tmp_path / "test_leaks.py").write_text(
        "import signal\n\n\n"
        "def test_leaves():\n    signal.signal(signal.SIGTERM, lambda *_: None)\n\n\n"
        "def test_after():\n    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL\n",
        encoding="utf-8",
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_leaks.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "2 passed, 1 error" in done.stdout, done.stdout[-3000:]
    assert "ERROR at teardown of test_leaves" in done.stdout
    assert "the test left a handler of its own for SIGTERM" in done.stdout


def test_the_suite_runs_alike_under_a_users_nmt_variables(tmp_path):
    """conftest takes the caller's NMT_DATA_DIR and NMT_DEBUG from every test: with them set,
    a test that relies on its config's own data root and one that wants one-line errors
    still pass (on a GPU machine, whose check script sets NMT_DATA_DIR, the first failed)."""
    env = {**os.environ, DATA_DIR_ENV: str(tmp_path / "elsewhere"), "NMT_DEBUG": "1"}
    tests = [
        "tests/test_corpora.py::test_prepare_names_each_corpus_on_the_command_line",
        "tests/test_cli.py::test_bad_override_and_missing_config_exit_2",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:]
