"""scripts/curves.py: how far validation BLEU moves between validations, nmt's run folders and
compare_peers.py curves read alike."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))

import curves  # noqa: E402


def _nmt_run(tmp_path, name: str, points: list[tuple[int, float, float]]):
    """An nmt run folder whose metrics.jsonl validated at (step, BLEU, loss), with training
    lines (no validation) between them."""
    folder = tmp_path / name
    folder.mkdir()
    lines = []
    for step, bleu, loss in points:
        lines.append({"step": step - 25, "loss": 3.0})
        lines.append({"step": step, "loss": 2.0, "val_loss": loss, "val_bleu": bleu})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return folder


def _peers_run(tmp_path, rows: dict[str, list[tuple[int, float]]]):
    results = [
        {"name": n, "curve": [{"minutes": 1.0, "step": s, "val_bleu": b} for s, b in pts]}
        for n, pts in rows.items()
    ]
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"limits": {}, "results": results, "seed": 1, "updates": 200}))
    return path


def test_moves_means_and_the_loss_of_an_nmt_run(tmp_path, capsys):
    run = _nmt_run(
        tmp_path, "a", [(50, 5.0, 3.0), (100, 10.0, 2.5), (150, 12.0, 2.6), (200, 11.0, 2.3)]
    )
    curves.main([str(run), "--start", "100", "--stop", "200", "--mean-from", "150"])
    out = capsys.readouterr().out.strip()
    # from update 100: BLEU 10, 12, 11 moves 2 and 1; loss 2.5, 2.6, 2.3 moves 0.1 and 0.3
    assert out == (
        f"{run}: 3 validations, updates 100-200; BLEU moves a median 1.50 (at most 2.00); "
        "mean BLEU over 150-200 11.50; validation loss moves a median 0.200"
    )


def test_a_peers_run_gives_each_rows_curve_and_the_table_lines_them_up(tmp_path, capsys):
    path = _peers_run(
        tmp_path, {"OpenNMT-py 3.5.1": [(50, 1.0), (100, 4.0)], "nmt fp32": [(100, 3.0)]}
    )
    curves.main([str(path), "--start", "50", "--stop", "100", "--mean-from", "50", "--table"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "run.json: OpenNMT-py 3.5.1: 2 validations, updates 50-100; BLEU moves a median 3.00 "
        "(at most 3.00); mean BLEU over 50-100 2.50"
    )
    assert lines[1] == "run.json: nmt fp32: fewer than two validations in updates 50-100"
    assert lines[3:] == [
        "| update | 50 | 100 |",
        "|---|---|---|",
        "| run.json: OpenNMT-py 3.5.1 | 1.0 | 4.0 |",
        "| run.json: nmt fp32 |  | 3.0 |",
    ]


def test_the_sessions_curves_read_as_the_readme_says():
    """OpenNMT-py's seed-1 curve moves a median 0.75, nmt fp32's 2.37 (session 52)."""
    got = curves.read([ROOT / "results" / "compare_peers_1200_updates_curve50_s52.json"])
    lines = [curves.summary(c, 600, 1200, 900) for c in got]
    assert "median 0.75 (at most 3.00); mean BLEU over 900-1200 43.40" in lines[0]
    assert "median 2.37 (at most 5.87); mean BLEU over 900-1200 44.48" in lines[1]


def _linked(link: Path, target: str) -> Path:
    link.symlink_to(target)
    return link.parent


@pytest.mark.parametrize(
    "make, says",
    [
        (lambda p: p / "missing", "no such file or folder"),
        (lambda p: p, "no metrics.jsonl: not an nmt run folder"),
        (lambda p: _nmt_run(p, "bad", []).joinpath("metrics.jsonl").parent, None),
        (lambda p: _peers_run(p, {"OpenNMT-py 3.5.1": []}), "no row has a curve"),
        # a device in the metrics' place: read until memory was full; now never opened
        (lambda p: _linked(p / "metrics.jsonl", "/dev/zero"), "not a regular file (a device)"),
    ],
    ids=["missing", "folder", "empty-run", "no-curve", "device"],
)
def test_what_is_not_a_curve_is_one_line(tmp_path, capsys, make, says):
    path = make(tmp_path)
    if says is None:  # a run folder with no validation yet: said, not an error
        curves.main([str(path)])
        assert "fewer than two validations" in capsys.readouterr().out
        return
    with pytest.raises(SystemExit) as e:
        curves.main([str(path)])
    assert says in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "line",
    ['{"step": 100, "val_bleu": 3.0}', "[1, 2]", "not json"],
    ids=["no-loss", "list", "text"],
)
def test_a_damaged_metrics_line_is_one_line(tmp_path, line):
    folder = _nmt_run(tmp_path, "a", [(50, 5.0, 3.0)])
    with (folder / "metrics.jsonl").open("a") as f:
        f.write(line + "\n")
    with pytest.raises(SystemExit) as e:
        curves.main([str(folder)])
    assert "is not a run's metrics" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("value", ["NaN", "Infinity"])
def test_a_value_that_is_not_a_finite_number_is_one_line_naming_its_update(tmp_path, value):
    """A diverged run's loss, or a damaged BLEU: no median is read across it."""
    folder = _nmt_run(tmp_path, "a", [(50, 5.0, 3.0), (100, 6.0, 2.0)])
    with (folder / "metrics.jsonl").open("a") as f:
        f.write(f'{{"step": 150, "val_bleu": 7.0, "val_loss": {value}}}\n')
    with pytest.raises(SystemExit) as e:
        curves.main([str(folder)])
    assert "validation loss at update 150" in str(e.value) and "\n" not in str(e.value)
    path = _peers_run(tmp_path, {"nmt fp32": [(50, 1.0), (100, float(value.lower()[:3]))]})
    with pytest.raises(SystemExit) as e:
        curves.main([str(path)])
    assert "val_bleu: expected a finite number" in str(e.value) and "\n" not in str(e.value)
