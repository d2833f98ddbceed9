"""scripts/bench_step.py: its fit, its step timing and its count of a search's rows."""

from __future__ import annotations

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
