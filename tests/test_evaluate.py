"""BLEU and chrF through sacrebleu (equal to its command line), the Multi30k protocol, and
`nmt eval` on a run's test split or on given files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nmt.cli import app
from nmt.evaluate import bleu, chrf, mmt_preprocess

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "data" / "tiny"
SHARED_MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"

REFS = [
    "Un chien marron court sur la plage.",
    "Une fille mange une pomme dans la cuisine.",
    "Deux femmes marchent dans la rue.",
    "L'homme porte un chapeau « rouge ».",
]
HYPS = [
    "Un chien brun court sur la plage.",
    "une fille mange une pomme dans la cuisine .",
    "Deux femmes marchent dans une rue.",
    "L'homme porte un chapeau rouge.",
]


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def sacrebleu_cli(ref: Path, hyp: Path, *args: str) -> str:
    """The score line of sacrebleu's own command line."""
    cmd = [sys.executable, "-m", "sacrebleu", str(ref), "-i", str(hyp), "-f", "text", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def files(tmp_path) -> tuple[Path, Path]:
    return write(tmp_path / "ref.fr", REFS), write(tmp_path / "hyp.fr", HYPS)


def test_bleu_is_sacrebleus_command_line_score(files):
    ref, hyp = files
    score = bleu(HYPS, REFS)
    assert score.line == sacrebleu_cli(ref, hyp)
    assert 0 < score.score < 100
    assert score.signature.startswith("nrefs:1|case:mixed|eff:no|tok:13a")


def test_lowercase_bleu_is_sacrebleus_lc(files):
    ref, hyp = files
    score = bleu(HYPS, REFS, lowercase=True)
    assert score.line == sacrebleu_cli(ref, hyp, "-lc")
    assert score.score > bleu(HYPS, REFS).score  # "une fille" now matches "Une fille"


def test_chrf_is_sacrebleus_command_line_score(files):
    ref, hyp = files
    assert chrf(HYPS, REFS).line == sacrebleu_cli(ref, hyp, "-m", "chrf")


def test_identical_text_scores_100():
    assert bleu(REFS, REFS).score == pytest.approx(100.0)
    assert chrf(REFS, REFS).score == pytest.approx(100.0)


def test_mmt_preprocessing_lowercases_normalises_and_tokenizes_french():
    (line,) = mmt_preprocess(["L'homme porte un chapeau « rouge »…"], "fr")
    assert line == 'l\' homme porte un chapeau " rouge " ...'


def test_wmt_mmt_protocol_ignores_case_quotes_and_spacing(tmp_path):
    refs = ["Un chien court sur l'herbe.", "Il dit « bonjour » !"]
    hyps = ["UN CHIEN court sur l'herbe .", 'Il dit "bonjour"!']
    assert bleu(hyps, refs).score < 60
    score = bleu(hyps, refs, protocol="wmt-mmt", lang="fr")
    assert score.score == pytest.approx(100.0)
    assert "protocol:wmt-mmt|lang:fr|" in score.signature and "tok:none" in score.signature


def test_wmt_mmt_is_bleu_on_the_preprocessed_tokens(tmp_path):
    ref = write(tmp_path / "ref.tok", mmt_preprocess(REFS, "fr"))
    hyp = write(tmp_path / "hyp.tok", mmt_preprocess(HYPS, "fr"))
    ours = bleu(HYPS, REFS, protocol="wmt-mmt", lang="fr")
    theirs = sacrebleu_cli(ref, hyp, "--tokenize", "none", "-lc", "--score-only", "-w", "6")
    assert ours.score == pytest.approx(float(theirs), abs=1e-6)


def test_mismatched_lengths_and_missing_language_are_refused():
    with pytest.raises(ValueError, match="3 hypotheses for 4 references"):
        bleu(HYPS[:3], REFS)
    with pytest.raises(ValueError, match="lang"):
        bleu(HYPS, REFS, protocol="wmt-mmt")


# --------------------------------------------------------------------------- nmt eval

runner = CliRunner()


def nmt(*args: str):
    return runner.invoke(app, list(args))


def test_eval_on_the_runs_test_split_prints_sacrebleus_line(tiny_run):
    result = nmt("eval", "-m", str(tiny_run.run_dir), "--beam", "2")
    assert result.exit_code == 0, result.output
    hyp = tiny_run.run_dir / "eval" / "test.beam2.hyp"
    assert result.stdout.strip() == sacrebleu_cli(TINY / "test.fr", hyp)
    assert len(hyp.read_text(encoding="utf-8").splitlines()) == len(
        (TINY / "test.en").read_text(encoding="utf-8").splitlines()
    )
    assert "test: " in result.stderr and "sentences/s" in result.stderr


def test_eval_json_with_files_and_output(tiny_run, tmp_path):
    src = write(tmp_path / "sample.en", tiny_run.train_src[:12])
    ref = write(tmp_path / "sample.fr", tiny_run.train_tgt[:12])
    out = tmp_path / "hyps" / "sample.hyp"
    out.parent.mkdir()
    args = ["eval", "-m", str(tiny_run.checkpoint), "--src", str(src), "--ref", str(ref)]
    result = nmt(*args, "--bleu", "--chrf", "--json", "--output", str(out), "--beam", "3")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["split"] == "sample" and report["n"] == 12 and report["beam"] == 3
    assert set(report["signature"]) == {"bleu", "chrf"}
    assert report["seconds"] > 0 and report["sentences_per_s"] > 0
    theirs = sacrebleu_cli(ref, out, "--score-only", "-w", "6")
    assert report["bleu"] == pytest.approx(float(theirs), abs=1e-6)
    assert report["bleu"] > 10  # training sentences: the overfitted model gets some right
    theirs = sacrebleu_cli(ref, out, "-m", "chrf", "--score-only", "-w", "6")
    assert report["chrf"] == pytest.approx(float(theirs), abs=1e-6)


def test_eval_wmt_mmt_protocol(tiny_run, tmp_path):
    out = tmp_path / "test.hyp"
    args = ["eval", "-m", str(tiny_run.run_dir), "--protocol", "wmt-mmt", "--json"]
    result = nmt(*args, "--output", str(out))
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    refs = (TINY / "test.fr").read_text(encoding="utf-8").splitlines()
    hyps = out.read_text(encoding="utf-8").splitlines()
    assert report["bleu"] == pytest.approx(bleu(hyps, refs, protocol="wmt-mmt", lang="fr").score)
    assert report["protocol"] == "wmt-mmt"


def test_eval_on_another_configs_test_sets(tiny_run, tmp_path, monkeypatch):
    """Two models compared on the same sets: --config names whose test sets are scored, here
    a two-corpus config whose second test set is held out of a TSV file."""
    rows = [f"{s}\t{t}" for s, t in zip(tiny_run.train_src, tiny_run.train_tgt, strict=True)]
    (tmp_path / "chat").mkdir()
    write(tmp_path / "chat" / "chat.tsv", rows)
    config = tmp_path / "other.yaml"
    config.write_text(
        f"""data:
  root: {tmp_path}
  corpora:
    - {{name: tiny, dir: {TINY}, train: train, valid: val, test: [test]}}
    - {{name: chat, format: tsv, train: chat.tsv, valid_size: 4, test_size: 6}}
""",
        encoding="utf-8",
    )
    result = nmt("eval", "-m", str(tiny_run.run_dir), "--config", str(config), "--json")
    assert result.exit_code == 0, result.output
    reports = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["split"], r["n"]) for r in reports] == [("tiny/test", 8), ("chat/test", 6)]
    hyps = tiny_run.run_dir / "eval" / "tiny.test.beam3.hyp"
    assert reports[0]["bleu"] == pytest.approx(
        float(sacrebleu_cli(TINY / "test.fr", hyps, "--score-only", "-w", "6")), abs=1e-6
    )


def test_eval_config_of_another_language_pair_is_refused(tiny_run, tmp_path):
    config = tmp_path / "de.yaml"
    config.write_text(
        f"data: {{dir: {TINY}, src_lang: de, tgt_lang: fr, train: train, valid: val}}\n",
        encoding="utf-8",
    )
    result = nmt("eval", "-m", str(tiny_run.run_dir), "--config", str(config))
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "its test sets are de->fr, but the model translates en->fr" in result.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--src", "a.en"], "--src and --ref go together"),
        (["--src", "a.en", "--ref", "short.fr"], "--src a.en has 2 lines but --ref short.fr has 1"),
        (["--src", "a.en", "--ref", "missing.fr"], "missing.fr: no such file"),
        (["--protocol", "multi-bleu"], "--protocol 'multi-bleu'"),
        (["--src", "a.en", "--ref", "a.en", "--config", "x.yaml"], "name one source of test"),
        (["--config", "missing.yaml"], "missing.yaml: file not found"),
    ],
)
def test_eval_user_errors_are_one_line_and_exit_2(tiny_run, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "a.en", ["A dog.", "A cat."])
    write(tmp_path / "short.fr", ["Un chien."])
    result = nmt("eval", "-m", str(tiny_run.run_dir), *args)
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr


@pytest.mark.skipif(not SHARED_MULTI30K.is_dir(), reason="needs ../shared/data/multi30k")
def test_wmt_mmt_on_multi30k_references_against_themselves():
    refs = (SHARED_MULTI30K / "test_2016_flickr.fr").read_text(encoding="utf-8").splitlines()
    assert len(refs) == 1000
    assert bleu(refs, refs, protocol="wmt-mmt", lang="fr").score == pytest.approx(100.0)
