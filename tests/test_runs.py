"""scripts/runs.py: several compare_peers.py runs side by side, and each nmt row's range of
figures over the runs of each CPU."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))

import runs  # noqa: E402

RESULTS = ROOT / "results"
ONMT = "OpenNMT-py 3.5.1"
ZEN4 = {"cpu": "AMD EPYC", "cpu_id": "family 25, model 17", "cpu_flags": ["avx2", "avx512_bf16"]}
ZEN5 = {"cpu": "AMD EPYC", "cpu_id": "family 26, model 2", "cpu_flags": ["avx2", "avx512_bf16"]}


def _row(name: str, tokens: float, precision: str = "fp32", decode=None) -> dict:
    """A result row; decode: (greedy seconds, greedy BLEU, beam-5 seconds, beam-5 BLEU)."""
    row = {"name": name, "tokens_per_s": tokens, "precision": precision, "decode": {}}
    if decode is not None:
        gs, gb, bs, bb = decode
        row["decode"] = {
            "greedy": {"seconds": gs, "bleu": gb},
            "beam5": {"seconds": bs, "bleu": bb},
        }
    return row


def _run(
    tmp_path, name: str, rows: list[dict], *, updates=1000, cpu=ZEN4, seed=1, interleave=None
) -> str:
    limits = {
        p: {"precision": p, "tokens_per_s": t, "gflops": 1.0, "mflop_per_token": 1.0, "products": 1}
        for p, t in (("fp32", 4000.0), ("bf16", 8000.0))
    }
    run = {"limits": limits, "results": rows, "updates": updates, "seed": seed, **cpu}
    if interleave is not None:  # compare_peers --interleave's seconds (0: one after another)
        run["interleave"] = interleave
    path = tmp_path / name
    path.write_text(json.dumps(run))
    return str(path)


def test_each_runs_ratios_and_each_cpus_ranges(tmp_path, capsys):
    a = _run(
        tmp_path,
        "a.json",
        [
            _row(ONMT, 1000, decode=(10.0, 40.0, 20.0, 41.0)),
            _row("nmt fp32, int8 decoding", 2000, decode=(2.0, 40.2, 5.0, 40.0)),
            _row("nmt bf16, int8 decoding", 4000, "bf16", decode=(2.5, 41.0, 4.0, 42.0)),
        ],
    )
    b = _run(  # a time budget: its decodings are of rows that trained different numbers
        tmp_path,
        "b.json",
        [_row(ONMT, 1600, decode=(5, 20, 10, 21)), _row("nmt fp32", 2400, decode=(1, 30, 2, 31))],
        updates=0,
    )
    c = _run(tmp_path, "c.json", [_row(ONMT, 1500), _row("nmt fp32", 3000)], cpu=ZEN5)
    runs.main([a, b, c])
    out = capsys.readouterr().out.splitlines()
    zen4, zen5 = "AMD EPYC (family 25, model 17)", "AMD EPYC (family 26, model 2)"
    assert out[2] == (
        f"| a.json | {zen4} | 1,000 updates, seed 1 | 1,000 | "
        "nmt fp32 2.00×, 50.0 %, greedy 5.00×, beam5 4.00×; "
        "nmt bf16 4.00×, 50.0 %, greedy 4.00×, beam5 5.00× |"
    )
    assert out[3] == f"| b.json | {zen4} | a time budget | 1,600 | nmt fp32 1.50×, 60.0 % |"
    ranges = [line for line in out if line.startswith("| AMD EPYC")]
    assert ranges == [
        # fp32's beam 5 is 1.0 BLEU below OpenNMT-py's: more than the target's 0.5
        f"| {zen4} (2) | nmt fp32 | 1.50-2.00× | 50.0-60.0 % | 5.00×, 0 of 1 | 4.00×, 1 of 1 |",
        f"| {zen4} (2) | nmt bf16 | 4.00× | 50.0 % | 4.00×, 0 of 1 | 5.00×, 0 of 1 |",
        f"| {zen5} (1) | nmt fp32 | 2.00× | 75.0 % | - | - |",
    ]
    assert out[-1] == f"{zen5}: flags avx2 avx512_bf16"


def test_a_run_without_opennmt_py_still_gives_its_shares(tmp_path, capsys):
    runs.main([_run(tmp_path, "a.json", [_row("nmt bf16", 2000, "bf16", decode=(1, 1, 1, 1))])])
    out = capsys.readouterr().out
    assert "| 1,000 updates, seed 1 | - | nmt bf16 -, 25.0 % |" in out
    assert "| nmt bf16 | - | 25.0 % | - | - |" in out


def _readme_columns() -> dict[str, tuple[list[str], str]]:
    """Each `scripts/runs.py` command the README quotes in a code block whose first line names
    a column of its table of where the targets stand (`# AMD EPYC Zen 4 (AVX512-BF16)`): that
    column's header -> (the runs the command reads, the column's cells)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("| target | AMD EPYC Zen 5") :].split("\n\n")[0].splitlines()
    headers = table[0].strip("| ").split(" | ")
    columns = {}
    for block in re.findall(r"```bash\n# (.+)\n((?:.|\n)+?)```", readme):
        header, command = block
        if "scripts/runs.py" not in command or header not in headers:
            continue
        cells = "\n".join(
            line.strip("| ").split(" | ")[headers.index(header)] for line in table[2:]
        )
        columns[header] = ([w for w in command.split() if w.startswith("results/")], cells)
    return columns


@pytest.mark.parametrize(
    "header, runs_at_least",
    [
        ("AMD EPYC Zen 4 (AVX512-BF16)", 20),
        ("AMD EPYC Zen 5 (AVX512-BF16)", 10),
        ("Xeon with AMX", 21),
        ("Zen 5, feed_dropout (sessions 53-55)", 13),
    ],
    ids=["zen4", "zen5", "xeon", "zen5-feed-dropout"],
)
def test_the_readmes_ranges_are_what_the_script_prints(header, runs_at_least, capsys):
    columns = _readme_columns()
    assert header in columns, f"the README quotes the runs.py command of its {header} column"
    files, column = columns[header]
    assert len(files) >= runs_at_least
    runs.main([str(ROOT / f) for f in files])
    out = capsys.readouterr().out.splitlines()
    ranges = out[out.index("") + 3 :]  # after the runs' table, the ranges' head and rule
    ranges = [line for line in ranges if line.startswith("| ")]
    assert len({line.split(" | ")[0] for line in ranges}) == 1, "one CPU a column"
    assert [line.split(" | ")[1] for line in ranges] == ["nmt fp32", "nmt bf16"]
    for line in ranges:
        for cell in line.strip("| ").split(" | ")[2:]:  # ×, % of limit, greedy and beam 5 ×
            assert cell.split(",")[0] in column, (cell, column)


@pytest.mark.parametrize(
    "args, says",
    [
        (["nope.json"], "runs.py: no run of compare_peers.py in nope.json"),
        (["README.md"], "runs.py: README.md is not a run compare_peers.py wrote"),
        (
            ["results/compare_peers_4min_s45.json", "./results/compare_peers_4min_s45.json"],
            "is named twice",
        ),
    ],
    ids=["missing", "not a run", "twice"],
)
def test_bad_input_is_one_line_without_a_traceback(args, says):
    proc = subprocess.run(
        [sys.executable, "scripts/runs.py", *args], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert says in proc.stderr.strip().splitlines()[-1], proc.stderr


def test_a_run_copied_under_another_name_is_refused_not_counted_twice(tmp_path):
    rows = [_row(ONMT, 1000), _row("nmt fp32", 2000)]
    a = _run(tmp_path, "a.json", rows)
    copy = tmp_path / "copy.json"
    copy.write_bytes((tmp_path / "a.json").read_bytes())
    with pytest.raises(SystemExit, match=r"copy.json holds the same run as .*a.json"):
        runs.main([a, str(copy)])
    laid_out = tmp_path / "laid_out.json"  # the same run written with other whitespace
    laid_out.write_text(json.dumps(json.loads(copy.read_text()), indent=3))
    with pytest.raises(SystemExit, match=r"laid_out.json holds the same run as .*a.json"):
        runs.main([a, str(laid_out)])
    other = _run(tmp_path, "b.json", [_row(ONMT, 1000), _row("nmt fp32", 2001)])
    runs.main([a, other])  # another run with other figures is read


def test_a_run_read_from_a_pipe_is_read_once_and_a_device_is_refused(tmp_path, capsys):
    """`runs.py <(cat a.json) <(cat b.json)`: each pipe is read once (a second read, for the
    copy check, found it empty: a JSON traceback); `/dev/zero` was read until memory was
    full, and stops at RUN_MAX_BYTES."""
    a = _run(tmp_path, "a.json", [_row(ONMT, 1000), _row("nmt fp32", 2000)])
    b = _run(tmp_path, "b.json", [_row(ONMT, 1000), _row("nmt fp32", 3000)])
    cats = [subprocess.Popen(["cat", f], stdout=subprocess.PIPE) for f in (a, b)]
    try:
        runs.main([f"/dev/fd/{c.stdout.fileno()}" for c in cats if c.stdout is not None])
    finally:
        for c in cats:
            c.wait()
    assert "| nmt fp32 2.00×, 50.0 % |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="^runs.py: /dev/zero: a device giving over 16,777,216"):
        runs.main(["/dev/zero", a])


def test_runs_without_an_nmt_row_are_one_line(tmp_path):
    with pytest.raises(SystemExit, match="^runs.py: no run has a row whose name starts with 'nmt'"):
        runs.main([_run(tmp_path, "a.json", [_row(ONMT, 1000)])])


def test_a_decoding_without_its_figures_is_left_out_not_a_traceback(tmp_path, capsys):
    """`Result.decode` is untyped JSON: a run stopped while decoding, or a damaged file, gives
    a row whose decoding lacks its seconds or BLEU, or holds something else."""
    rows = [
        _row(ONMT, 1000, decode=(10, 40, 20, 41)),
        _row("nmt fp32", 2000, decode=(2, 40, 5, 41)),
    ]
    rows[1]["decode"]["greedy"]["seconds"] = "fast"
    del rows[1]["decode"]["beam5"]["bleu"]
    runs.main([_run(tmp_path, "a.json", rows)])
    out = capsys.readouterr().out
    assert "| nmt fp32 2.00×, 50.0 % |" in out  # neither decoding counted
    assert "| nmt fp32 | 2.00× | 50.0 % | - | - |" in out


def test_runs_from_before_family_and_model_are_grouped_by_their_flags(tmp_path, capsys):
    """Both "AMD EPYC": an EPYC with AVX2 only and a Zen 5, neither with family and model."""
    old = {"cpu": "AMD EPYC", "cpu_flags": ["avx2", "fma"]}
    a = _run(tmp_path, "a.json", [_row(ONMT, 1000), _row("nmt fp32", 1000)], cpu=old)
    old = {**old, "cpu_flags": ["avx2", "fma", "avx512f", "avx512_bf16"]}
    b = _run(tmp_path, "b.json", [_row(ONMT, 1000), _row("nmt fp32", 2000)], cpu=old)
    runs.main([a, b])
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if line.startswith("| AMD EPYC")] == [
        "| AMD EPYC (flags avx2 fma) (1) | nmt fp32 | 1.00× | 25.0 % | - | - |",
        "| AMD EPYC (flags avx2 fma avx512f avx512_bf16) (1) | nmt fp32 | 2.00× | 50.0 % | - | - |",
    ]
    assert not out[-1].startswith("AMD EPYC")  # no flags line: the groups are named by them


def test_the_zen_5s_early_runs_join_a_later_run_of_their_noted_family(tmp_path, capsys):
    """Sessions 16-22's Zen 5 runs recorded no family and model: they join the runs of family
    26's one model among those read, and stand alone, named by the family, without one. Each
    run's line says what it recorded; the Zen 4 and a run not in the table are left as they
    were."""
    old = {"cpu": "AMD EPYC", "cpu_flags": ["avx2", "fma", "avx512f", "avx512_bf16"]}
    early = _run(
        tmp_path,
        "compare_peers_1000_updates_int8_s19.json",
        [_row(ONMT, 1000), _row("nmt fp32", 2000)],
        cpu=old,
    )
    late = _run(tmp_path, "late.json", [_row(ONMT, 1000), _row("nmt fp32", 3000)], cpu=ZEN5)
    zen4 = _run(tmp_path, "zen4.json", [_row(ONMT, 1000), _row("nmt fp32", 1500)])
    unlisted = _run(tmp_path, "s41.json", [_row(ONMT, 1000), _row("nmt fp32", 1000)], cpu=old)
    zen5 = "AMD EPYC (family 26, model 2)"
    runs.main([early, late, zen4, unlisted])
    out = capsys.readouterr().out.splitlines()
    said = "| compare_peers_1000_updates_int8_s19.json | AMD EPYC (family 26, model not recorded) |"
    assert any(line.startswith(said) for line in out)
    assert [line for line in out if line.startswith("| AMD EPYC (")] == [
        f"| {zen5} (2) | nmt fp32 | 2.00-3.00× | 50.0-75.0 % | - | - |",
        "| AMD EPYC (family 25, model 17) (1) | nmt fp32 | 1.50× | 37.5 % | - | - |",
        "| AMD EPYC (flags avx2 fma avx512f avx512_bf16) (1) | nmt fp32 | 1.00× | 25.0 % | - | - |",
    ]
    runs.main([early])
    out = capsys.readouterr().out
    assert "| AMD EPYC (family 26, model not recorded) (1) | nmt fp32 | 2.00× |" in out


def test_spread_counts_each_training_once_and_says_how_the_toolkits_move_together(tmp_path, capsys):
    """--spread: nmt's tokens/s moving with OpenNMT-py's (r 1) leaves the ratio steady; a run
    that decoded a run's models again carries its training figures, and counts once."""
    a = _run(tmp_path, "a.json", [_row(ONMT, 1000), _row("nmt fp32", 2000)])
    b = _run(tmp_path, "b.json", [_row(ONMT, 1100), _row("nmt fp32", 2200)])
    c = _run(
        tmp_path,
        "c.json",
        [_row(ONMT, 900), _row("nmt fp32", 1800), _row("nmt bf16", 3000, "bf16")],
    )
    again = _run(  # a's models decoded again: its training figures, decodings of its own
        tmp_path,
        "again.json",
        [_row(ONMT, 1000, decode=(10, 40, 20, 41)), _row("nmt fp32", 2000, decode=(2, 40, 5, 41))],
    )
    runs.main(["--spread", a, b, c, again])
    out = capsys.readouterr().out.splitlines()
    head = out.index("") + 1 + out[out.index("") + 1 :].index("") + 1  # the third table
    assert out[head:] == [
        "| CPU | row | trainings | OpenNMT-py tokens/s | its tokens/s | × OpenNMT-py "
        "| % of limit | the limit | r, its tokens/s and OpenNMT-py's |",
        "|---|---|---|---|---|---|---|---|---|",
        "| AMD EPYC (family 25, model 17) | nmt fp32 | 3 | 10.0 % | 10.0 % | 0.0 % | 10.0 % "
        "| 0.0 % | 1.00 |",
    ]  # nmt bf16 trained once: no spread


def test_spread_says_no_r_where_a_toolkit_did_not_move(tmp_path, capsys):
    files = [
        _run(tmp_path, f"{n}.json", [_row(ONMT, 1000), _row("nmt fp32", tokens)])
        for n, tokens in enumerate((1800, 2000, 2200))
    ]
    runs.main(["--spread", *files])
    assert capsys.readouterr().out.splitlines()[-1] == (
        "| AMD EPYC (family 25, model 17) | nmt fp32 | 3 | 0.0 % | 10.0 % | 10.0 % | 10.0 % "
        "| 0.0 % | - |"
    )


def test_spread_of_fewer_than_three_trainings_says_so(tmp_path, capsys):
    runs.main(["--spread", _run(tmp_path, "a.json", [_row(ONMT, 1000), _row("nmt fp32", 2000)])])
    assert capsys.readouterr().out.splitlines()[-1] == (
        "spread: no CPU has three trainings of an nmt row"
    )


def test_a_negative_rate_is_a_damaged_file_in_one_line(tmp_path):
    """A rate below 0 is no run compare_peers.py wrote: refused where every reader reads runs
    (`peers.previous.previous_run`), not given a negative ratio or share."""
    bad = _run(tmp_path, "a.json", [_row(ONMT, 1000), _row("nmt fp32", -2000)])
    with pytest.raises(
        SystemExit, match=r"is not a run .*tokens_per_s: -2000 is below the minimum 0\)"
    ):
        runs.main([bad])


def test_spread_of_figures_too_large_to_square_stays_finite(tmp_path, capsys):
    files = [
        _run(tmp_path, f"{n}.json", [_row(ONMT, 1000.0 + n), _row("nmt fp32", tokens)])
        for n, tokens in enumerate((1e308, 1.5e308, 1.2e308))
    ]
    runs.main(["--spread", *files])
    last = capsys.readouterr().out.splitlines()[-1]
    assert "inf" not in last and "nan" not in last, last


def test_spread_keeps_runs_whose_rows_took_turns_apart(tmp_path, capsys):
    """--spread asks how much a way of measuring moves from run to run: runs whose rows took
    turns (--interleave) are a group of their own beside their CPU's others, and each run's
    line says how its rows trained. The ranges still hold every run of the CPU."""
    files = [
        # a run from before the field (None) trained its rows one after another
        _run(
            tmp_path,
            f"after{n}.json",
            [_row(ONMT, 1000), _row("nmt fp32", t)],
            updates=0,
            interleave=0.0 if n else None,
        )
        for n, t in enumerate((1800, 2000, 2200))
    ]
    files += [
        _run(
            tmp_path,
            f"turns{n}.json",
            [_row(ONMT, 1000), _row("nmt fp32", t)],
            updates=0,
            interleave=seconds,
        )
        for n, (t, seconds) in enumerate(((1900, 20.0), (2000, 20.0), (2100, 60.0)))
    ]
    runs.main(["--spread", *files])
    out = capsys.readouterr().out.splitlines()
    zen4 = "AMD EPYC (family 25, model 17)"
    assert f"| turns2.json | {zen4} | a time budget, in turns of 60 s | 1,000 | " in out[7]
    assert f"| after0.json | {zen4} | a time budget | 1,000 | " in out[2]
    assert f"| {zen4} (6) | nmt fp32 | 1.80-2.20× | 45.0-55.0 % | - | - |" in out
    assert out[-2:] == [
        f"| {zen4} | nmt fp32 | 3 | 0.0 % | 10.0 % | 10.0 % | 10.0 % | 0.0 % | - |",
        f"| {zen4}, rows in turns | nmt fp32 | 3 | 0.0 % | 5.0 % | 5.0 % | 5.0 % | 0.0 % | - |",
    ]


def test_a_runs_turns_below_0_are_a_damaged_file_in_one_line(tmp_path):
    bad = _run(tmp_path, "a.json", [_row(ONMT, 1000), _row("nmt fp32", 2000)], interleave=-20)
    with pytest.raises(
        SystemExit, match=r"is not a run .*interleave: -20 is below the minimum 0\)"
    ):
        runs.main([bad])


def test_runs_whose_learning_rate_decayed_are_a_group_of_their_own(tmp_path, capsys):
    """Their BLEU is another model's: a range over both would mix two schedules."""
    rows = [_row(ONMT, 1000, decode=(10.0, 40.0, 20.0, 41.0))]
    plain = _run(tmp_path, "a.json", [*rows, _row("nmt fp32", 2000, decode=(2, 40, 5, 41))])
    decayed = json.loads(Path(plain).read_text()) | {"decay": [800, 100, 0.5], "seed": 2}
    decayed["results"][1] = _row("nmt fp32", 3000, decode=(2.5, 38, 5, 41))
    (tmp_path / "b.json").write_text(json.dumps(decayed))
    runs.main([plain, str(tmp_path / "b.json")])
    out = capsys.readouterr().out.splitlines()
    zen4 = "AMD EPYC (family 25, model 17)"
    assert out[3].startswith(f"| b.json | {zen4} | 1,000 updates, seed 2, --decay 800,100,0.5 |")
    assert [line for line in out if line.startswith("| AMD EPYC")] == [
        f"| {zen4} (1) | nmt fp32 | 2.00× | 50.0 % | 5.00×, 0 of 1 | 4.00×, 0 of 1 |",
        f"| {zen4}, --decay 800,100,0.5 (1) | nmt fp32 | 3.00× | 75.0 % | 4.00×, 1 of 1 | "
        "4.00×, 0 of 1 |",
    ]


def test_a_decay_not_of_three_numbers_is_a_damaged_file_in_one_line(tmp_path):
    """`--decay` is START, EVERY, FACTOR: a run's file with fewer is refused, not read as a
    decay of its own."""
    path = Path(_run(tmp_path, "a.json", [_row(ONMT, 1000), _row("nmt fp32", 2000)]))
    path.write_text(json.dumps(json.loads(path.read_text()) | {"decay": [800]}))
    with pytest.raises(SystemExit, match=r"is not a run .*decay: expected START, EVERY, FACTOR"):
        runs.main([str(path)])


def test_runs_whose_weights_were_averaged_are_a_group_of_their_own(tmp_path, capsys):
    """`--smoothing`: another model again; with a decay too, a group of both."""
    rows = [_row(ONMT, 1000, decode=(10.0, 40.0, 20.0, 41.0))]
    plain = _run(tmp_path, "a.json", [*rows, _row("nmt fp32", 2000, decode=(2, 40, 5, 41))])
    smoothed = json.loads(Path(plain).read_text()) | {"smoothing": 1e-4, "seed": 2}
    smoothed["results"][1] = _row("nmt fp32", 3000, decode=(2.5, 38, 5, 41))
    (tmp_path / "b.json").write_text(json.dumps(smoothed))
    both = smoothed | {"decay": [800, 100, 0.5], "seed": 3}
    (tmp_path / "c.json").write_text(json.dumps(both))
    runs.main([plain, str(tmp_path / "b.json"), str(tmp_path / "c.json")])
    out = capsys.readouterr().out.splitlines()
    zen4 = "AMD EPYC (family 25, model 17)"
    assert out[3].startswith(f"| b.json | {zen4} | 1,000 updates, seed 2, --smoothing 0.0001 |")
    groups = [line.split(" | nmt")[0] for line in out if line.startswith("| AMD EPYC")]
    assert groups == [
        f"| {zen4} (1)",
        f"| {zen4}, --smoothing 0.0001 (1)",
        f"| {zen4}, --decay 800,100,0.5, --smoothing 0.0001 (1)",
    ]


@pytest.mark.parametrize("factor", [0, -1e-4, 2, "a"])
def test_a_smoothing_outside_0_to_1_is_a_damaged_file_in_one_line(tmp_path, factor):
    path = Path(_run(tmp_path, "a.json", [_row(ONMT, 1000), _row("nmt fp32", 2000)]))
    path.write_text(json.dumps(json.loads(path.read_text()) | {"smoothing": factor}))
    with pytest.raises(SystemExit, match=r"is not a run .*smoothing: "):
        runs.main([str(path)])
