"""Never touch what the user owns: real `nmt` processes against special files, symlinks,
hard links, inputs named as outputs, a run directory's foreign files, and broken inputs.
Each refusal is exit code 2 and one line, and the user's file is unchanged byte for byte,
with its mode and inode."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"
TINY_DATA = ROOT / "tests" / "data" / "tiny"


def nmt(*args: str, cwd: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "nmt", *map(str, args)],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        env=env,
        timeout=300,
    )


def assert_refused(done: subprocess.CompletedProcess, *needles: str) -> None:
    err = done.stderr.decode("utf-8", "replace")
    assert done.returncode == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err


class Kept:
    """A user's file as it was: bytes, mode, inode."""

    def __init__(self, path: Path) -> None:
        self.path = path
        st = os.stat(path)
        self.data, self.mode, self.ino = path.read_bytes(), st.st_mode, st.st_ino

    def unchanged(self) -> bool:
        st = os.stat(self.path)
        return (self.path.read_bytes(), st.st_mode, st.st_ino) == (self.data, self.mode, self.ino)


def user_file(path: Path, text: str = "the user's own text\n", mode: int = 0o600) -> Kept:
    path.write_text(text)
    path.chmod(mode)
    return Kept(path)


# ---------------------------------------------------------------- output paths


def test_dev_null_and_dev_stdout_stay_what_they_are(tiny_run, tmp_path):
    done = nmt("translate", "-m", tiny_run.run_dir, "a dog", "-o", "/dev/null", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    done = nmt("translate", "-m", tiny_run.run_dir, "a dog", "-o", "/dev/stdout", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()  # written through to the pipe


def test_a_fifo_is_written_in_place(tiny_run, tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    done = nmt("translate", "-m", tiny_run.run_dir, "a dog", "-o", fifo, cwd=tmp_path)
    reader.join(timeout=60)
    assert done.returncode == 0, done.stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and got and got[0].strip()


def test_a_symlink_is_followed_not_replaced(tiny_run, tmp_path):
    target = tmp_path / "real.txt"
    user_file(target, mode=0o640)
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    done = nmt("translate", "-m", tiny_run.run_dir, "a dog", "-o", link, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() != "the user's own text\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640


def test_a_replaced_output_keeps_its_mode_and_a_hard_link_stays_one_file(tiny_run, tmp_path):
    out = tmp_path / "out.txt"
    user_file(out, mode=0o600)
    other = tmp_path / "other-name.txt"
    os.link(out, other)
    ino = out.stat().st_ino
    done = nmt("translate", "-m", tiny_run.run_dir, "a dog", "-o", out, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert out.stat().st_ino == ino == other.stat().st_ino  # written in place
    assert other.read_text() == out.read_text() != "the user's own text\n"
    plain = tmp_path / "plain.txt"
    user_file(plain, mode=0o600)
    done = nmt("translate", "-m", tiny_run.run_dir, "a dog", "-o", plain, cwd=tmp_path)
    assert done.returncode == 0 and stat.S_IMODE(plain.stat().st_mode) == 0o600


@pytest.mark.parametrize("option", ["--output", "--attention-plot", "--output via symlink"])
def test_a_read_only_output_is_refused_and_kept(tiny_run, tmp_path, option):
    """A file nobody may write (0444) is the user's mark: refused before any work, even for
    root (who could replace it), the file unchanged; also behind a symlink."""
    kept = user_file(tmp_path / "mine.png", mode=0o444)
    name, flag = kept.path, option.split()[0]
    if option.endswith("symlink"):
        name = tmp_path / "link.png"
        name.symlink_to(kept.path)
    done = nmt("translate", "-m", tiny_run.run_dir, "a dog", flag, name, cwd=tmp_path)
    assert_refused(done, f"{flag} {name}: the file is read-only")
    assert kept.unchanged()


@pytest.mark.parametrize("which", ["--ref", "--src", "hardlink-of-ref", "symlink-of-src"])
def test_eval_refuses_an_output_that_is_one_of_its_inputs(tiny_run, tmp_path, which):
    src = user_file(tmp_path / "test.en", "a dog runs\n", 0o644)
    ref = user_file(tmp_path / "test.fr", "un chien court\n", 0o644)
    out = {"--ref": ref.path, "--src": src.path}.get(which)
    if which == "hardlink-of-ref":
        out = tmp_path / "hyps.txt"
        os.link(ref.path, out)
        ref = Kept(ref.path)
    elif which == "symlink-of-src":
        out = tmp_path / "hyps.txt"
        out.symlink_to(src.path)
    args = ["eval", "-m", tiny_run.run_dir, "--src", src.path, "--ref", ref.path, "-o", out]
    assert_refused(nmt(*args, cwd=tmp_path), "is the same file as")
    assert src.unchanged() and ref.unchanged()


def test_translate_refuses_to_write_over_its_input_or_its_model(tiny_run, tmp_path):
    inp = user_file(tmp_path / "in.txt", "a dog\n", 0o644)
    assert_refused(
        nmt("translate", "-m", tiny_run.run_dir, "-i", inp.path, "-o", inp.path, cwd=tmp_path),
        "--input",
    )
    assert inp.unchanged()
    model = Kept(tiny_run.checkpoint)
    args = ["translate", "-m", tiny_run.checkpoint, "a dog", "-o", tiny_run.checkpoint]
    assert_refused(nmt(*args, cwd=tmp_path), "--model")
    args = ["translate", "-m", tiny_run.checkpoint, "a dog", "--attention-plot", tmp_path / "x.png"]
    assert nmt(*args, cwd=tmp_path).returncode == 0
    assert model.unchanged()


def test_numbered_plots_never_replace_files_the_user_did_not_name(tiny_run, tmp_path):
    taken = user_file(tmp_path / "fig-2.png", "not a plot\n", 0o644)
    args = ["translate", "-m", tiny_run.run_dir, "a dog", "a cat", "--attention-plot", "fig.png"]
    assert_refused(nmt(*args, cwd=tmp_path), "fig-2.png", "exists")
    assert taken.unchanged() and not (tmp_path / "fig-1.png").exists()


@pytest.mark.parametrize(
    ("plot", "needle"), [("fig.txt", "ending .png"), ("missing/fig.png", "does not exist")]
)
def test_interactive_mode_checks_its_plot_path_too(tiny_run, tmp_path, plot, needle):
    args = ["translate", "-m", tiny_run.run_dir, "--interactive", "--attention-plot", plot]
    assert_refused(nmt(*args, cwd=tmp_path, stdin=b"a dog\n"), needle)
    assert not (tmp_path / "missing").exists()


def test_interactive_mode_refuses_input_that_is_not_utf8(tiny_run, tmp_path):
    args = ["translate", "-m", tiny_run.run_dir, "--interactive"]
    assert_refused(nmt(*args, cwd=tmp_path, stdin=b"\xff\xfe cat\na dog\n"), "line 1", "UTF-8")


# ---------------------------------------------------------------- run directories


def _train(tmp_path: Path, *sets: str) -> subprocess.CompletedProcess:
    args = ["train", TINY, "--set", f"data.dir={TINY_DATA}", "--set", "train.max_steps=2"]
    args += ["--set", "run.tensorboard=false"]
    for s in sets:
        args += ["--set", s]
    return nmt(*args, cwd=tmp_path)


def test_train_never_rewrites_a_config_the_user_keeps_in_the_run_directory(tmp_path):
    exp = tmp_path / "experiment"
    exp.mkdir()
    mine = user_file(exp / "config.yaml", "# my notes and settings\nmodel: {}\n", 0o644)
    for extra in ([], ["--overwrite"]):
        done = nmt(
            "train", TINY, "--set", f"data.dir={TINY_DATA}", "--set", f"run.dir={exp}", *extra,
            cwd=tmp_path,
        )  # fmt: skip
        assert_refused(done, "config.yaml", "not written by a run")
        assert mine.unchanged() and sorted(p.name for p in exp.iterdir()) == ["config.yaml"]


@pytest.mark.parametrize("name", ["..", ".", "a/../../b", ""])
def test_a_config_name_cannot_leave_runs(tmp_path, name):
    config = tmp_path / "c.yaml"
    config.write_text(TINY.read_text() + f"\nname: {name!r}\n")
    assert_refused(nmt("check-config", config, cwd=tmp_path), "name:")


def test_a_run_dir_that_is_a_file_is_refused(tmp_path):
    f = user_file(tmp_path / "afile")
    assert_refused(_train(tmp_path, f"run.dir={f.path}"), "is a file")
    assert f.unchanged()


@pytest.mark.slow
def test_a_runs_own_checkpoints_are_not_outputs_and_weights_only_do_not_resume(tmp_path):
    run = tmp_path / "run"
    assert _train(tmp_path, f"run.dir={run}", "train.valid_every=1").returncode == 0
    last = Kept(run / "last.pt")
    for name in ("last.pt", "best.pt", "step-2.pt"):
        args = ["average", run / "step-1.pt", run / "step-2.pt", "-o", run / name, "--overwrite"]
        assert_refused(nmt(*args, cwd=tmp_path), "a run's own checkpoint")
    assert last.unchanged()
    # A weights-only file in last.pt's place (copied by hand): --resume says so in one line.
    averaged = tmp_path / "avg.pt"
    args = ["average", run / "last.pt", run / "best.pt", "-o", averaged]
    assert nmt(*args, cwd=tmp_path).returncode == 0
    (run / "last.pt").unlink()
    (run / "last.pt").write_bytes(averaged.read_bytes())
    resume = ["train", TINY, "--set", f"data.dir={TINY_DATA}", "--set", f"run.dir={run}"]
    resume += ["--set", "train.max_steps=4", "--resume"]
    assert_refused(nmt(*resume, cwd=tmp_path), "cannot resume", "optimizer")


@pytest.mark.slow
def test_a_directory_where_runs_latest_goes_is_left_alone(tmp_path):
    (tmp_path / "runs" / "latest").mkdir(parents=True)
    keep = user_file(tmp_path / "runs" / "latest" / "notes.txt")
    done = _train(tmp_path, f"run.dir={tmp_path / 'run'}")
    assert done.returncode == 0, done.stderr
    assert b"runs/latest is not a link nmt made" in done.stdout + done.stderr
    assert keep.unchanged() and not list((tmp_path / "runs").glob(".latest*"))


# ---------------------------------------------------------------- broken inputs


def _broken(tiny_run, tmp_path: Path, change) -> Path:
    state = torch.load(tiny_run.checkpoint, weights_only=True)
    change(state)
    path = tmp_path / "broken.pt"
    torch.save(state, path)
    return path


def _reshape(state):
    k = next(iter(state["model"]))
    state["model"][k] = torch.zeros(3, 3)


BREAKAGES = {
    "a wrongly shaped weight": (_reshape, "do not fit"),
    "a missing weight": (lambda s: s["model"].pop(next(iter(s["model"]))), "lacks"),
    "a config that is not a mapping": (lambda s: s.update(config=[1, 2]), "not a mapping"),
    "no config": (lambda s: s.pop("config"), "config"),
}


@pytest.mark.parametrize("breakage", BREAKAGES)
def test_a_broken_checkpoint_is_one_line_everywhere(tiny_run, tmp_path, breakage):
    change, needle = BREAKAGES[breakage]
    broken = _broken(tiny_run, tmp_path, change)
    assert_refused(nmt("translate", "-m", broken, "a dog", cwd=tmp_path), needle)
    ensemble = ["translate", "-m", tiny_run.checkpoint, "-m", broken, "a dog"]
    assert_refused(nmt(*ensemble, cwd=tmp_path))
    average = ["average", tiny_run.checkpoint, broken, "-o", tmp_path / "avg.pt"]
    assert_refused(nmt(*average, cwd=tmp_path))
    assert not (tmp_path / "avg.pt").exists()


def test_eval_on_empty_files_is_one_line(tiny_run, tmp_path):
    empty = user_file(tmp_path / "empty.en", "", 0o644)
    ref = user_file(tmp_path / "empty.fr", "", 0o644)
    args = ["eval", "-m", tiny_run.run_dir, "--src", empty.path, "--ref", ref.path]
    assert_refused(nmt(*args, cwd=tmp_path), "empty")


def test_serve_refuses_an_unknown_log_level_and_endless_waits(tiny_run, tmp_path):
    assert_refused(nmt("serve", "-m", tiny_run.run_dir, "--log-level", "foo", cwd=tmp_path), "foo")
    for value in ("inf", "nan"):
        args = ["serve", "-m", tiny_run.run_dir, "--batch-wait-ms", value]
        assert_refused(nmt(*args, cwd=tmp_path), "--batch-wait-ms", "finite number from 0 to 1000")


@pytest.mark.parametrize(
    ("yaml_text", "needle"),
    [
        ("decode:\n  alpha: .nan\n", "decode.alpha: expected a finite number"),
        ("decode:\n  max_len_ratio: .inf\n", "decode.max_len_ratio: expected a finite number"),
        ("train:\n  lr: -.inf\n", "train.lr: expected a finite number"),
    ],
)
def test_non_finite_numbers_in_a_config_are_refused(tmp_path, yaml_text, needle):
    config = tmp_path / "c.yaml"
    config.write_text(TINY.read_text() + "\n" + yaml_text)
    assert_refused(nmt("check-config", config, cwd=tmp_path), needle)


def test_a_yaml_alias_bomb_is_refused_at_once_in_one_short_line(tmp_path):
    levels = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        levels.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(levels) + "\n")
    done = nmt("check-config", bomb, cwd=tmp_path)
    assert_refused(done, "aliases", "not allowed")
    assert len(done.stderr) < 300
    assert_refused(nmt("check-config", TINY, "--set", "model.attention=*x", cwd=tmp_path))


def test_long_values_are_shortened_in_error_messages(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(TINY.read_text() + "\ndecode:\n  beam: '" + "x" * 5000 + "'\n")
    done = nmt("check-config", config, cwd=tmp_path)
    assert_refused(done, "decode.beam")
    assert len(done.stderr) < 300


def test_eval_leaves_the_folder_of_a_checkpoint_kept_outside_a_run_alone(tiny_run, tmp_path):
    """`nmt eval -m mine/model.pt`: the hypotheses went to mine/eval/, the data cache to
    mine/data/ (a user's own eval/test.beam3.hyp there replaced). Now neither, unless -o."""
    mine = tmp_path / "mine"
    mine.mkdir()
    model = mine / "model.pt"
    model.write_bytes(tiny_run.checkpoint.read_bytes())
    keep = user_file(mine / "notes.txt")
    done = nmt("eval", "-m", model, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert b"hypotheses not kept" in done.stderr and b"-o FILE" in done.stderr
    assert sorted(p.name for p in mine.iterdir()) == ["model.pt", "notes.txt"] and keep.unchanged()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]  # nor the working folder
    # in the run directory nmt made, as before
    assert nmt("eval", "-m", tiny_run.run_dir, cwd=tmp_path).returncode == 0
    assert list((tiny_run.run_dir / "eval").glob("*.hyp"))
