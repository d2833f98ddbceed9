"""scripts/bench_step.py: its fit, its step timing and its count of a search's rows."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT, TinyRun

from nmt.translate import Translator

sys.path.insert(0, str(ROOT / "scripts"))
import bench_step  # noqa: E402


def test_fit_recovers_a_line() -> None:
    points = [(r, 500.0 + 30.0 * r) for r in (1, 8, 16, 64)]
    fixed, per_row = bench_step.fit(points)
    assert fixed == pytest.approx(500.0) and per_row == pytest.approx(30.0)


def test_rows_of_search_counts_every_step_and_leaves_the_model_as_it_was(tiny_run: TinyRun) -> None:
    tr = Translator.from_checkpoint(tiny_run.checkpoint)
    sources = tiny_run.train_src[:7]
    want = [t.text for t in tr.translate(sources, beam=1)]
    seen = bench_step.rows_of_search(tr, sources, beam=1)
    # the first step carries every sentence of the one batch; rows only ever leave
    assert seen[0] == len(sources) and seen == sorted(seen, reverse=True)
    assert "step" not in vars(tr.model)  # the counting wrapper is gone
    assert [t.text for t in tr.translate(sources, beam=1)] == want
    beam_rows = bench_step.rows_of_search(tr, sources, beam=3)
    assert beam_rows[0] == 3 * len(sources)


def test_step_us_times_greedy_and_beam_steps(tiny_run: TinyRun) -> None:
    tr = Translator.from_checkpoint(tiny_run.checkpoint)
    ids = [s.pieces.ids for s in tr.prepare(tiny_run.train_src[:4])][::-1]
    for beam in (1, 3):
        assert bench_step.step_us(tr, ids, 4, beam, calls=3) > 0
    with pytest.raises(SystemExit, match="--rows 9"):
        bench_step.step_us(tr, ids, 9, 1, calls=3)


@pytest.mark.parametrize(
    ("src", "says"),
    [("missing.en", "no such file"), ("bad.en", "line 2 is not valid UTF-8"), ("few.en", "has 2")],
)
def test_bad_sources_are_one_line_and_no_traceback(tiny_run: TinyRun, tmp_path, src, says):
    (tmp_path / "bad.en").write_bytes(b"a dog\n\xff\xfe\n")
    (tmp_path / "few.en").write_text("a dog\na cat\n", encoding="utf-8")
    script = ROOT / "scripts" / "bench_step.py"
    argv = [str(tiny_run.checkpoint), "--src", str(tmp_path / src), "--rows", "4", "--calls", "1"]
    done = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True)
    assert done.returncode != 0 and says in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
