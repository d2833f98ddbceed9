"""scripts/seeds.py: BLEU after N updates over several compare_peers.py runs, a seed each."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))

import seeds  # noqa: E402

RESULTS = ROOT / "results"


def _run_file(tmp_path, name: str, rows: dict, *, seed=1, updates=1000, **fields) -> str:
    """A compare_peers.py --out file with `rows`: model name -> (greedy, beam 5) BLEU or None;
    `fields`: the run's others."""
    results = []
    for model, bleu in rows.items():
        decode = {} if bleu is None else {"greedy": {"bleu": bleu[0]}, "beam5": {"bleu": bleu[1]}}
        results.append({"name": model, "decode": decode})
    run = {"limits": {}, "results": results, "seed": seed, "updates": updates, **fields}
    path = tmp_path / name
    path.write_text(json.dumps(run))
    return str(path)


def test_each_rows_difference_is_taken_seed_by_seed(tmp_path, capsys):
    onmt = "OpenNMT-py 3.5.1"
    one = _run_file(tmp_path, "a.json", {onmt: (40, 41), "nmt fp32, int8": (41, 43)}, seed=2)
    two = _run_file(tmp_path, "b.json", {onmt: (30, 31), "nmt fp32": (32, 31)}, seed=1)
    seeds.main([one, two])
    lines = capsys.readouterr().out.splitlines()
    assert "| seed 1 | seed 2 | mean | − OpenNMT-py 3.5.1 (± s.e.) |" in lines[0]  # seed order
    assert lines[2].startswith(f"| {onmt} | 30.00 / 31.00 | 40.00 / 41.00 | 35.00 / 36.00 |")
    # differences: greedy 2 and 1 (mean 1.5, sd 0.71, s.e. 0.5); beam 0 and 2 (1 ± 1)
    assert lines[3] == (
        "| nmt fp32 | 32.00 / 31.00 | 41.00 / 43.00 | 36.50 / 37.00 | +1.50 ± 0.50 / +1.00 ± 1.00 |"
    )


@pytest.mark.parametrize(
    "runs, fp32, bf16",
    [
        (
            ["s19", "s19_seed2", "s20_seed3", "s20_seed4"],  # AMD EPYC, sessions 19-20
            "| 45.37 / 47.03 | +0.08 ± 0.44 / +0.20 ± 0.56 |",
            "| 44.88 / 46.51 | -0.41 ± 0.59 / -0.32 ± 0.66 |",
        ),
        (
            ["s34_passes", "s40_seed2", "s40_seed3", "s40_seed4"],  # Xeon with AMX
            "| 45.31 / 46.73 | +0.12 ± 0.77 / +0.01 ± 0.57 |",
            "| 45.54 / 47.31 | +0.34 ± 0.47 / +0.59 ± 0.59 |",
        ),
    ],
    ids=["amd", "xeon"],
)
def test_the_readmes_four_seed_table_is_what_the_script_prints(runs, fp32, bf16, capsys):
    """The README's table of four seeds, each machine's from its committed runs."""
    seeds.main([str(RESULTS / f"compare_peers_1000_updates_int8_{n}.json") for n in runs])
    out = capsys.readouterr().out
    assert fp32 in out and bf16 in out
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for row in (fp32, bf16):  # the README writes a minus sign
        assert row.replace("-", "−").strip("| ") in readme


def test_runs_of_several_cpus_say_each_seeds_cpu(tmp_path, capsys):
    one = _run_file(tmp_path, "a.json", {"OpenNMT-py": (40, 41)})
    two = _run_file(tmp_path, "b.json", {"OpenNMT-py": (30, 31)}, seed=2)
    seeds.main([one, two])  # neither named a CPU: nothing said
    assert "ran on" not in capsys.readouterr().out
    run = json.loads((tmp_path / "b.json").read_text())
    run |= {"cpu": "AMD EPYC", "cpu_id": "family 25, model 17", "cpu_flags": ["avx2", "fma"]}
    (tmp_path / "b.json").write_text(json.dumps(run))
    seeds.main([one, two])
    out = capsys.readouterr().out.splitlines()
    assert out[-2:] == [
        "seed 1 ran on a CPU its run did not name",
        "seed 2 ran on AMD EPYC (family 25, model 17); flags: avx2 fma",
    ]


def test_a_row_not_decoded_in_every_run_is_left_out_with_a_word(tmp_path, capsys):
    one = _run_file(tmp_path, "a.json", {"OpenNMT-py": (40, 41), "nmt bf16": None, "Joey": (9, 9)})
    two = _run_file(tmp_path, "b.json", {"OpenNMT-py": (30, 31), "nmt bf16": (30, 30)}, seed=2)
    seeds.main([one, two])
    out = capsys.readouterr().out
    assert "| nmt bf16 |" not in out and "| Joey |" not in out and "| OpenNMT-py |" in out
    assert f"left out: nmt bf16: {one} has no greedy BLEU or beam5 BLEU" in out
    assert f"left out: Joey: {two} has no row" in out


@pytest.mark.parametrize(
    "second, says",
    [
        ({"updates": 0}, "b.json is a run of --minutes"),
        ({"updates": 700}, "b.json trained 700 updates"),
        ({"seed": 1}, "b.json is seed 1 again"),
        ({"seed": None}, "b.json has no seed"),
        (
            {"decay": [800, 100, 0.5]},
            "b.json trained with --decay 800,100,0.5, .*a.json with no --decay; expected runs "
            "of one learning-rate schedule",
        ),
        (
            {"smoothing": 1e-4},
            "b.json trained with --smoothing 0.0001, .*a.json with no --smoothing; expected "
            "runs of one weight average",
        ),
    ],
    ids=["minutes", "other updates", "same seed", "no seed", "decay", "smoothing"],
)
def test_runs_that_do_not_compare_are_refused_in_one_line(tmp_path, second, says):
    one = _run_file(tmp_path, "a.json", {"OpenNMT-py": (40, 41)})
    two = _run_file(tmp_path, "b.json", {"OpenNMT-py": (30, 31)}, **{"seed": 2, **second})
    with pytest.raises(SystemExit, match=f"^seeds.py: .*{says}"):
        seeds.main([one, two])


@pytest.mark.parametrize(
    "args, says",
    [
        (["results/compare_peers_1000_updates_int8_s19.json"], "expected at least two runs"),
        (["nope.json", "README.md"], "seeds.py: no run of compare_peers.py in nope.json"),
        (["README.md", "README.md"], "seeds.py: README.md is not a run compare_peers.py wrote"),
    ],
)
def test_bad_input_is_one_line_without_a_traceback(args, says):
    proc = subprocess.run(
        [sys.executable, "scripts/seeds.py", *args], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert says in proc.stderr.strip().splitlines()[-1], proc.stderr


def test_against_gives_what_another_way_of_training_moved_in_each_toolkit(tmp_path, capsys):
    """`--against`: the same seeds trained without --smoothing; each model's own difference."""
    onmt, smooth = "OpenNMT-py 3.5.1", {"smoothing": 1e-4}
    a = _run_file(tmp_path, "a.json", {onmt: (41, 42), "nmt fp32": (44, 44)}, seed=1, **smooth)
    b = _run_file(tmp_path, "b.json", {onmt: (40, 43), "nmt fp32": (43, 45)}, seed=2, **smooth)
    c = _run_file(tmp_path, "c.json", {onmt: (40, 41), "nmt fp32": (42, 45)}, seed=1)
    d = _run_file(
        tmp_path, "d.json", {onmt: (40, 41), "nmt fp32": (41, 45), "Joey": (9, 9)}, seed=2
    )
    seeds.main([a, b, "--against", d, c])
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("")
    assert lines[at + 1 :] == [
        "| --smoothing 0.0001 − the reference's way, seed by seed | greedy / beam5 (± s.e.) | "
        "cells that rose |",
        "|---|---|---|",
        # greedy +1 and 0 (0.5 ± 0.5); beam 5 +1 and +2 (1.5 ± 0.5): 3 of 4 rose
        "| OpenNMT-py 3.5.1 | +0.50 ± 0.50 / +1.50 ± 0.50 | 3 of 4 |",
        # greedy +2 and +2; beam 5 −1 and 0
        "| nmt fp32 | +2.00 ± 0.00 / -0.50 ± 0.50 | 2 of 4 |",
    ]


@pytest.mark.parametrize(
    "against, says",
    [
        (
            [("c.json", 1, {}), ("d.json", 3, {})],
            "--against: seeds 1, 3 after 1,000 updates, the runs",
        ),
        ([("c.json", 1, {"smoothing": 1e-4}), ("d.json", 2, {"smoothing": 1e-4})], "both sets"),
        ([("c.json", 1, {"smoothing": 1e-4}), ("d.json", 2, {})], "expected runs of one weight"),
    ],
    ids=["other seeds", "the same way", "a set of two ways"],
)
def test_against_refuses_sets_that_do_not_compare_in_one_line(tmp_path, against, says):
    smooth = {"smoothing": 1e-4}
    a = _run_file(tmp_path, "a.json", {"OpenNMT-py": (41, 42)}, seed=1, **smooth)
    b = _run_file(tmp_path, "b.json", {"OpenNMT-py": (40, 43)}, seed=2, **smooth)
    others = [_run_file(tmp_path, n, {"OpenNMT-py": (40, 41)}, seed=s, **f) for n, s, f in against]
    with pytest.raises(SystemExit, match=f"^seeds.py: .*{says}"):
        seeds.main([a, b, "--against", *others])
