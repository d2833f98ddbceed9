"""The scripts read and write the files a user names through `nmt.files`, as the commands do:
a bad input is one line before any work, and an output is refused before any work where it
would replace something the user keeps (a read-only file, one of the inputs, a folder).
Each case below was a traceback, or a write over the user's file, before."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TINY_CONFIG, TINY_DATA, TinyRun

from nmt.config import load_config
from nmt.tokenizer import train_or_load

SCRIPTS = ROOT / "scripts"
sys.path.insert(0, str(SCRIPTS))

import argtypes  # noqa: E402


def _refused(script: str, *args: str, says: str) -> subprocess.CompletedProcess:
    """Run `script`; it must stop with one line naming the problem, and no traceback."""
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / script), *args], capture_output=True, text=True, timeout=120
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], done.stderr
    return done


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """A good source, a non-UTF-8 one, a blank one, and the user's read-only file."""
    names = {"good": "good.en", "bad": "bad.en", "blank": "blank.en", "mine": "mine.json"}
    paths = {key: tmp_path / name for key, name in names.items()}
    paths["good"].write_text("a dog runs\na cat sleeps\n", encoding="utf-8")
    paths["bad"].write_bytes(b"a dog\n\xff\n")
    paths["blank"].write_text("\n \n", encoding="utf-8")
    paths["mine"].write_text("mine\n", encoding="utf-8")
    paths["mine"].chmod(0o444)
    return paths


def _kept(path: Path) -> None:
    assert path.read_text(encoding="utf-8") == "mine\n" and path.stat().st_mode & 0o777 == 0o444


def test_bench_translate_reads_its_inputs_before_loading_a_model(tiny_run: TinyRun, files):
    ckpt = str(tiny_run.checkpoint)
    done = _refused("bench_translate.py", ckpt, "--src", str(files["bad"]), says="line 2")
    assert done.stdout == ""  # told before the model loaded and printed its header
    _refused("bench_translate.py", ckpt, "--src", str(files["good"]), "--ref",
             str(files["mine"]), says="--ref")  # fmt: skip
    _refused("bench_translate.py", ckpt, "--src", "/no/such.en", says="/no/such.en: no such file")
    _refused("bench_translate.py", ckpt, "--src", str(files["blank"]), says="no sentence to decode")
    # and with good inputs it runs its default variants (the tanh one had lost step with
    # the scorer's signature: a TypeError)
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "bench_translate.py"), ckpt, "--src", str(files["good"]),
         "--beams", "1", "--repeats", "1"], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "as-is" in done.stdout and "tanh" in done.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--sentences", "/no/such.en"], "no such file"),
        (["--sentences", "{blank}"], "no sentence to decode"),
        (["--sentences", "{good}", "--out", "{mine}"], "read-only"),
        (["--sentences", "{good}", "--out", "{good}"], "is the same file as --sentences"),
        # and a server that cannot start says why in the same line (a traceback before)
        (["--sentences", "{good}"], "nmt serve did not start: /no/such/run: no such run"),
        (["--sentences", "{good}", "--url", "http://127.0.0.1:9"], "no nmt server answers"),
        (["--sentences", "{good}", "--url", "nourl"], "--url nourl: no nmt server answers"),
    ],
)
def test_load_test_refuses_before_any_server_starts(files, args, says):
    args = [a.format(**{k: str(v) for k, v in files.items()}) for a in args]
    _refused("load_test.py", "--model", "/no/such/run", *args, says=says)
    _kept(files["mine"])
    assert files["good"].read_text(encoding="utf-8") == "a dog runs\na cat sleeps\n"


def test_names_set_reads_and_writes_through_nmt_files(tmp_path: Path, files):
    table = tmp_path / "names.tsv"
    table.write_text("en\tfr\tname\tvariant\nHelga ate.\tHelga a mangé.\tHelga\tcased\n")
    _refused("names_set.py", "score", str(table), "/no/such.fr", says="no such file")
    _refused("names_set.py", "score", str(table), str(files["bad"]), says="not valid UTF-8")
    broken = tmp_path / "broken.tsv"
    broken.write_text("en\tfr\nHelga ate.\tHelga a mangé.\n", encoding="utf-8")
    _refused("names_set.py", "score", str(broken), str(files["good"]), says="expected the columns")
    # the set is written only where it may be, before the corpora are read
    _refused("names_set.py", "write", "--data", "/no/such/data", "--out", str(files["mine"]),
             says="read-only")  # fmt: skip
    _kept(files["mine"])
    _refused("names_set.py", "write", "--data", "/no/such/data", "--out", str(tmp_path / "new.tsv"),
             says="no such file")  # fmt: skip
    assert not (tmp_path / "new.tsv").exists()
    # the translations never over the set itself, refused before a model loads
    _refused("names_set.py", "model", "/no/such/run", "--names", str(table), "--hyps", str(table),
             says="is the same file as --names")  # fmt: skip


def test_attention_study_and_the_page_shot_check_their_outputs_first(tmp_path: Path, files):
    work = tmp_path / "work"
    _refused("attention_study.py", "--work", str(work), "--out", str(files["mine"]),
             says="--out")  # fmt: skip
    assert not work.exists()  # before the study made anything
    config = ROOT / "configs" / "tiny.yaml"
    _refused("attention_study.py", "--work", str(work), "--config", str(config), "--out",
             str(tmp_path / "study.json"), "--figure", str(config), says="--figure")  # fmt: skip
    _refused("browser.py", "--out", str(files["mine"]), says="read-only")
    _kept(files["mine"])


@pytest.mark.parametrize(
    "args",
    [
        ["bench_decode.py", "--beam", "0"],
        ["bench_decode.py", "--min-len", "9", "--max-len", "3"],
        ["bench_model.py", "--steps", "0"],
        ["bench_loss.py", "--smoothing", "1.5"],
        ["bench_fused_scorer.py", "--rows", "0"],
        ["bench_fused_scorer.py", "configs/reference_rnn.yaml", "--steps", "0"],
        ["bench_fused_scorer.py", "--decode", "model.pt"],  # and no --src
        ["bench_fused_scorer.py", "--parts", "scorer,heads"],
        ["bench_compiled_step.py", "--check", "fp16"],
        ["bench_compiled_step.py", "configs/reference_rnn.yaml", "--steps", "0"],
        ["bench_model.py", "--styles", "luong,nope"],
        ["bench_model.py", "--dtypes", "fp8"],
        ["bench_translate.py", "model.pt", "--src", "x.en", "--variants", "as-is,nope"],
        ["compare_peers.py", "--only", "nmt-fp32,marian"],
        ["attention_study.py", "--seeds", "0"],
        ["names_set.py", "model", "runs/x", "--beam", "0"],
        ["load_test.py", "--clients", "0"],
        ["load_test.py", "--seconds", "nan"],
    ],
)
def test_a_number_out_of_range_is_argparses_one_line_before_any_work(args):
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / args[0]), *args[1:]],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(f"{args[0]}")  # `prog: error: ...`
    assert "error: " in done.stderr.strip().splitlines()[-1]


def test_a_list_of_names_says_which_are_unknown_and_what_it_takes():
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "bench_model.py"), "--styles", "luong,nope,luong,nope"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == "", done.stderr
    said = "argument --styles: unknown 'nope'; expected some of bahdanau, luong, luong+feeding"
    assert done.stderr.strip().splitlines()[-1].endswith(said)


def test_a_list_of_names_is_read_once_each_in_its_order():
    parse = argtypes.some_of(["fp32", "bf16", "fp16"])
    assert parse("bf16,fp32,bf16") == ["bf16", "fp32"]
    with pytest.raises(argparse.ArgumentTypeError, match="unknown ''; expected some of fp32"):
        parse("fp32,")


def _users_latest(tmp_path: Path) -> Path:
    """The user's `runs/latest` (in the folder the scripts run from: the suite's tmp_path),
    a link to the user's own run."""
    mine = tmp_path / "runs" / "mine"
    mine.mkdir(parents=True)
    (tmp_path / "runs" / "latest").symlink_to("mine")
    return mine


@pytest.mark.slow
def test_the_scripts_trainings_leave_the_users_runs_latest_alone(tmp_path: Path):
    """compare_peers' nmt rows and attention_study's cells train with `nmt train` from the
    user's folder: each pointed runs/latest, the model translate/eval/serve use without
    --model, at its own run (in --work, perhaps deleted since), not the user's."""
    sys.path.insert(0, str(SCRIPTS))
    import attention_study
    from peers import nmt_toolkit

    mine = _users_latest(tmp_path)
    tiny, config = ROOT / "tests" / "data" / "tiny", ROOT / "configs" / "tiny.yaml"
    work = tmp_path / "work"
    work.mkdir()
    args = dict(data=tiny, work=work, seed=1, log_every=1, curve=0, nmt_set=[])
    peers = argparse.Namespace(**args, minutes=0, updates=2, nmt_config=config, turns=None)
    row = nmt_toolkit.nmt_train("nmt fp32", "fp32", peers, work / "nmt-fp32")
    assert row.steps == 2 and (work / "nmt-fp32" / "last.pt").is_file()
    study = argparse.Namespace(**args, steps=2, config=config)
    attention_study.train_cell(study, "luong", "dot", 1, work / "cell", copy=False)
    assert (work / "cell" / "last.pt").is_file()
    assert (tmp_path / "runs" / "latest").resolve() == mine.resolve()


def test_attention_study_fills_only_a_work_folder_of_its_own(tmp_path: Path):
    """It deletes a cell's run cut short (runs/CELL) to start it again: in a folder of the
    user's holding a folder of that name, the user's would be lost. Refused, kept."""
    work = tmp_path / "mine"
    notes = work / "runs" / "luong.dot.seed1.steps400" / "notes.txt"
    notes.parent.mkdir(parents=True)
    notes.write_text("mine\n", encoding="utf-8")
    outs = ["--out", str(tmp_path / "study.json"), "--figure", str(tmp_path / "study.png")]
    _refused("attention_study.py", "--work", str(work), *outs, says="did not make, and not empty")
    assert notes.read_text(encoding="utf-8") == "mine\n"
    assert sorted(p.name for p in work.iterdir()) == ["runs"]  # nothing added


def _shortlist_of(checkpoint: Path, out: Path, cwd: Path) -> dict:
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "add_shortlist.py"), str(checkpoint), str(out)],
        capture_output=True, text=True, timeout=120, cwd=cwd,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return torch.load(out, weights_only=True)["shortlist"]


def test_add_shortlist_reads_the_checkpoints_own_pieces_and_writes_only_out(
    tiny_run: TinyRun, tmp_path: Path
):
    """The run's folder named in the checkpoint may be gone (or relative to another working
    directory), or hold another run's tokenizer. The script prepared the data there anyway:
    it made that folder, trained a tokenizer into it, and built the table in those pieces
    (or stopped on the other tokenizer's settings). Now: the checkpoint's own pieces, and
    nothing written but OUT."""
    want = _shortlist_of(tiny_run.checkpoint, tmp_path / "want.pt", tmp_path)
    state = torch.load(tiny_run.checkpoint, weights_only=True)
    other = tmp_path / "other"  # another run's tokenizer: a smaller vocabulary
    cfg = load_config(TINY_CONFIG, [f"data.dir={TINY_DATA}", "tokenizer.vocab_size=100"])
    src, tgt = ((TINY_DATA / f"train.{x}").read_text().splitlines() for x in ("en", "fr"))
    train_or_load(cfg.tokenizer, other, src, tgt, log=print)
    before = sorted(p.name for p in other.iterdir())
    for run_dir in ("gone", str(other)):
        state["config"]["run"]["dir"] = run_dir
        torch.save(state, tmp_path / "moved.pt")
        cwd = tmp_path / f"cwd-{len(run_dir)}"
        cwd.mkdir()
        got = _shortlist_of(tmp_path / "moved.pt", tmp_path / "got.pt", cwd)
        assert got.keys() == want.keys() and all(_same(got[k], want[k]) for k in want)
        assert not list(cwd.iterdir()) and not (tmp_path / "gone").exists()
    assert sorted(p.name for p in other.iterdir()) == before


def _same(a: object, b: object) -> bool:
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_profile_step_leaves_a_folder_of_the_users_that_has_the_runs_name_alone(
    tiny_run: TinyRun, tmp_path: Path
):
    """`profile_step.py` (and `bench_fused_scorer.py` through it) prepared the data in the
    config's run folder, whatever held that name: a folder of the user's gained spm.model and
    a data cache (and, lacking nmt's mark, then refused `nmt train`), or its own spm.model
    was read as the tokenizer. Now such a folder is left as it was, with or without a
    checkpoint, and the data goes to a temporary folder."""
    mine = tmp_path / "runs" / "tiny"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("mine\n", encoding="utf-8")
    (mine / "spm.model").write_text("my own sentencepiece notes\n", encoding="utf-8")
    before = _tree(mine)
    sets = ["--set", f"data.dir={TINY_DATA}", "--set", f"run.dir={mine}"]
    for extra in ([], ["--checkpoint", str(tiny_run.checkpoint)]):
        subprocess.run(
            [sys.executable, str(SCRIPTS / "profile_step.py"), str(TINY_CONFIG), *sets, *extra,
             "--steps", "1", "--profile-steps", "0"],
            cwd=tmp_path, capture_output=True, text=True, timeout=300, check=True,
        )  # fmt: skip
        assert _tree(mine) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]


def test_a_scripts_data_uses_the_run_folder_only_where_nmt_made_it_with_that_tokenizer(
    tiny_run: TinyRun, tmp_path: Path
):
    """`script_data.prepared`: the run folder's cache where nmt made it and it holds the given
    tokenizer (or none is given); a temporary folder otherwise, the run folder untouched."""
    sys.path.insert(0, str(SCRIPTS))
    from script_data import prepared

    from nmt.tokenizer import Tokenizer

    theirs, cfg = Tokenizer.load(tiny_run.run_dir), tiny_run.config
    before = _tree(tiny_run.run_dir)
    for given in (None, theirs):  # nmt's folder, its tokenizer: read (its cache as it was)
        data = prepared(cfg, tmp_path / "unused", given)
        assert data.tokenizer.to_bytes() == theirs.to_bytes()
        assert not (tmp_path / "unused").exists() and _tree(tiny_run.run_dir) == before
    other = load_config(TINY_CONFIG, [f"data.dir={TINY_DATA}", "tokenizer.vocab_size=100"])
    src, tgt = ((TINY_DATA / f"train.{x}").read_text().splitlines() for x in ("en", "fr"))
    small = train_or_load(other.tokenizer, tmp_path / "small", src, tgt, log=print)
    data = prepared(cfg, tmp_path / "tmp", small)  # another tokenizer: in tmp, in its pieces
    assert data.tokenizer.to_bytes() == small.to_bytes() and (tmp_path / "tmp").is_dir()
    assert _tree(tiny_run.run_dir) == before
    users = load_config(TINY_CONFIG, [f"data.dir={TINY_DATA}", f"run.dir={tmp_path / 'mine'}"])
    (tmp_path / "mine").mkdir()
    prepared(users, tmp_path / "tmp2")  # a folder nmt did not make: left empty
    assert not list((tmp_path / "mine").iterdir()) and (tmp_path / "tmp2").is_dir()
