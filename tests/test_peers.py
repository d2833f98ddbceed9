"""scripts/compare_peers.py's own logic, without training anything: the machine's limit
(`peers/limit.py`) on the device each row trained on, and a table whose empty cells are
always said why."""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict

import pytest
import torch
from children import interrupted_start, refusal
from train_setup import ROOT, tiny

sys.path.insert(0, str(ROOT / "scripts"))
import compare_peers  # noqa: E402
import limit_in_step  # noqa: E402
from peers import (
    common,  # noqa: E402
    nmt_toolkit,  # noqa: E402
    options,  # noqa: E402
    previous,  # noqa: E402
)
from peers import limit as limit_mod  # noqa: E402
from peers.common import DECODINGS, Decoding, Result, decode_in_turns  # noqa: E402
from peers.limit import (  # noqa: E402
    Cpu,
    Limit,
    Product,
    Timings,
    limit_key,
    product_of,
    step_products,
    this_cpu,
    time_step,
)
from peers.previous import kept_rows  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from nmt import onednn  # noqa: E402

COMPARE_PEERS = ROOT / "scripts" / "compare_peers.py"


@pytest.fixture
def one_round(monkeypatch):
    """The limit's timing in one round: the figures are not under test, only what they are
    made of."""
    monkeypatch.setattr(limit_mod, "ROUNDS", 1)


def test_limit_key_keeps_cpu_names_and_names_gpu_ones():
    # runs written before GPUs were handled keyed their limits "fp32" and "bf16"
    assert limit_key("fp32") == "fp32" and limit_key("bf16", "cpu") == "bf16"
    assert limit_key("fp16", "cuda") == "cuda fp16"


def test_step_products_cover_the_output_layer(tmp_path):
    cfg = tiny(tmp_path)
    vocab = 37
    seen, tokens = step_products(cfg, vocab=vocab, src_len=5, tgt_len=4)
    b = cfg.train.batch_size
    assert tokens == b * 5  # 4 pieces and EOS a sentence
    # the output layer's forward: every target position against the whole vocabulary
    assert any(p.n == vocab and p.m == b * 5 for p in seen), seen


class _Products(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Product | None] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if func.overloadpacket.__name__ not in ("t", "expand", "view", "transpose"):
            self.seen.append(product_of(func, args))
        return func(*args, **(kwargs or {}))


def test_product_of_reads_m_k_n_of_every_product_op():
    """The limit and `profile_step.py --in-place` name a product by what it computes:
    (b batches of) m × k times k × n, whichever ATen op ran it."""
    a, b, w = torch.randn(3, 4), torch.randn(4, 5), torch.randn(5, 4)
    ab, bb = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    calls = {
        "mm": lambda: torch.mm(a, b),
        "addmm": lambda: torch.addmm(torch.randn(5), a, b),
        "bmm": lambda: torch.bmm(ab, bb),
        "baddbmm": lambda: torch.baddbmm(torch.randn(2, 3, 5), ab, bb),
    }
    if onednn.available:  # x (3, 4) times the weight (5, 4) transposed
        calls["oneDNN"] = lambda: onednn.pointwise(a, w)
    for name, call in calls.items():
        with _Products() as record:
            call()
        want = Product("mm", 1, 3, 4, 5) if name in ("mm", "addmm", "oneDNN") else None
        want = want or Product("bmm", 2, 3, 4, 5)
        assert [p for p in record.seen if p is not None] == [want], name
    with _Products() as record:
        torch.randn(3, 4).sigmoid()
    assert not any(record.seen)


def _profile_step(run_dir, *args: str) -> subprocess.CompletedProcess:
    """`scripts/profile_step.py ARGS` on the tiny data, its run folder `run_dir`."""
    sets = ["--set", f"data.dir={ROOT / 'tests/data/tiny'}", "--set", f"run.dir={run_dir}"]
    return subprocess.run(
        [sys.executable, "scripts/profile_step.py", *args, *sets],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip


def test_profile_step_in_place_prints_each_product_in_place_and_alone(tmp_path):
    args = ["--steps", "1", "--profile-steps", "2", "--in-place", "--top", "2"]
    done = _profile_step(tmp_path / "run", "configs/tiny.yaml", *args)
    assert done.returncode == 0, done.stderr
    head, *rows = [line for line in done.stdout.splitlines() if line.strip()]
    assert "ms in place" in head and "ms alone" in head and "everything else" in head
    assert rows[0].startswith("| product") and len(rows) == 4  # header, rule, 2 products
    assert rows[2].startswith("| mm ") or rows[2].startswith("| bmm ")


def test_profile_step_paired_smoothing_times_the_average_after_each_update(tmp_path):
    """`--paired smoothing`: each batch stepped with and without the weights' running average
    folded in after the update (what `train.exponential_smoothing` adds to a step)."""
    import profile_step

    model = torch.nn.Linear(3, 2)
    switch = profile_step.LEVERS["smoothing"](model)
    average = profile_step._Average.smoothed.model
    for on in (False, True):
        switch(on)
        before = average.weight.detach().clone()
        with torch.no_grad():
            model.weight.add_(1.0)
        profile_step._Average.after_update()
        assert torch.equal(average.weight, before) != on
    switch(False)
    args = ["--steps", "2", "--profile-steps", "0", "--paired", "smoothing"]
    done = _profile_step(tmp_path / "run", "configs/tiny.yaml", *args)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1].startswith("fp32, smoothing off: ")


@pytest.mark.parametrize(
    "args, says",
    [
        (["configs/nope.yaml"], "error: configs/nope.yaml: file not found"),
        (["configs/tiny.yaml", "--precision", "fp17"], "error: train.precision 'fp17'"),
        (["configs/tiny.yaml", "--steps", "0"], "--steps: '0': expected a whole number >= 1"),
        (["configs/tiny.yaml", "--checkpoint", "nope.pt"], "error: nope.pt: no such checkpoint"),
    ],
)
def test_profile_step_refuses_bad_input_in_one_line(tmp_path, args, says):
    proc = _profile_step(tmp_path, *args, "--in-place")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert says in proc.stderr.strip().splitlines()[-1], proc.stderr


def _share_of_printed(share: str, rate: float, limit: float) -> bool:
    """Whether `share` ('4.5%', to 0.1 %) is rate / limit for some rates that print as these
    (rounded to the unit)."""
    low, high = (rate - 0.5) / (limit + 0.5), (rate + 0.5) / (limit - 0.5)
    return low - 0.0005 <= float(share.rstrip("%")) / 100 <= high + 0.0005


def test_profile_step_share_prints_each_minute_and_three_rates(tmp_path):
    """`--share`: a table row a minute (steps, the step's tokens/s, the limit at its typical
    and fastest timings, two shares), then the rates over all steps."""
    done = _profile_step(tmp_path, "configs/tiny.yaml", "--steps", "2", "--share", "0.01")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    header = lines.index(next(x for x in lines if x.startswith("| minute |")))
    (row,) = lines[header + 2 : -1]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[0] == "1" and int(cells[1]) >= 1
    step, typical, fastest = (float(cells[i].replace(",", "")) for i in (2, 3, 5))
    assert fastest >= typical > 0 and step > 0
    # each share is its rates' ratio, read from rates printed to the unit: at the tiny model's
    # few hundred tokens/s, that rounding alone can move the share's last digit
    assert _share_of_printed(cells[4], step, typical) and _share_of_printed(cells[6], step, fastest)
    assert lines[-1].startswith("over all ") and "as compare_peers counts" in lines[-1]


@pytest.mark.parametrize(
    "args, says",
    [
        (["--share", "0"], "--share: '0': expected a number of minutes above 0"),
        (["--share", "1", "--in-place"], "not allowed with argument --share"),
        (["--paired", "decoder", "--count-syncs"], "not allowed with argument --paired"),
    ],
)
def test_profile_step_refuses_a_bad_share_or_two_modes_in_one_line(tmp_path, args, says):
    proc = _profile_step(tmp_path, "configs/tiny.yaml", *args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert says in proc.stderr.strip().splitlines()[-1], proc.stderr


def test_a_windows_limit_is_its_typical_and_its_fastest_timings():
    """Two rounds of two products (2 and 1 a step): typical = the rounds' mean seconds a
    step, fastest = each product's fastest timing; the step's rate over its own seconds."""
    p, q = Product("mm", 1, 2, 3, 4), Product("bmm", 2, 1, 3, 4)
    window = limit_in_step._Window(50, 2.0, [{p: 1.0, q: 2.0}, {p: 3.0, q: 1.0}])
    rate, typical, fastest = window.rates(collections.Counter({p: 2, q: 1}), 100)
    assert (rate, typical, fastest) == (25.0, 100 / 5.5, 100 / 3.0)
    both = window.joined(limit_in_step._Window(10, 1.0, [{p: 0.5, q: 0.5}]))
    assert both.tokens == 60 and both.step_s == 3.0 and len(both.rounds) == 3
    assert both.rates(collections.Counter({p: 2, q: 1}), 100)[2] == 100 / 1.5


def test_limit_on_the_cpu(tmp_path, one_round):
    cfg = tiny(tmp_path)
    lim = time_step(cfg, "fp32", vocab=37, src_len=5, tgt_len=4).limit()
    assert lim.device == "cpu" and lim.precision == "fp32"
    assert lim.tokens_per_s > 0 and lim.gflops > 0 and lim.products > 0
    # the FLOPs a token times the tokens a second are the rate
    assert lim.gflops * 1e3 == pytest.approx(lim.mflop_per_token * lim.tokens_per_s)


def test_fp16_limit_is_refused_on_a_cpu(tmp_path):
    with pytest.raises(ValueError, match="fp16 is for GPUs"):
        time_step(tiny(tmp_path), "fp16", vocab=37)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (none on this machine)")
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_limit_on_the_gpu(tmp_path, one_round, precision):
    cfg = tiny(tmp_path)
    timed = time_step(cfg, precision, vocab=37, src_len=5, tgt_len=4, device=torch.device("cuda"))
    lim = timed.limit()
    assert lim.device == "cuda" and lim.tokens_per_s > 0


def _limit(precision: str, device: str = "cpu", tokens_per_s: float = 10_000.0) -> Limit:
    return Limit(precision, tokens_per_s, 500.0, 50.0, 100, "torch 100%", device)


def _decoded(seconds: float, bleu: float) -> dict[str, dict]:
    return {label: {"seconds": seconds * beam, "bleu": bleu} for label, beam in DECODINGS}


def test_table_fills_every_cell_it_can_and_says_why_for_the_others():
    onmt = Result("OpenNMT-py 3.5.1", 2_000.0, peak_rss_gb=3.0, steps=1000)
    onmt.decode = _decoded(4.0, 45.0)
    fp32 = Result("nmt fp32", 6_000.0, peak_rss_gb=2.5, steps=1000, precision="fp32")
    fp32.decode = _decoded(1.0, 45.5)
    # a GPU row whose limit was not measured, and a row that decoded nothing
    fp16 = Result("nmt fp16", 50_000.0, steps=1000, precision="fp16", device="cuda")
    fp16.decode = _decoded(0.5, 45.1)
    broken = Result("nmt bf16", 9_000.0, steps=1000, precision="bf16", note="it crashed")
    limits = {"fp32": _limit("fp32"), "bf16": _limit("bf16", tokens_per_s=18_000.0)}
    rows = compare_peers.table([onmt, fp32, fp16, broken], onmt, limits).splitlines()[2:]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    assert cells[0][1:3] == ["2,000 (1.00x)", "20.0% of fp32"]
    assert cells[1][1:3] == ["6,000 (3.00x)", "60.0% of fp32"]
    assert cells[1][5:] == ["1.0 (4.00x)", "45.5", "5.0 (4.00x)", "45.5"]
    assert cells[2][2] == "-" and cells[3][5:] == ["-"] * 4
    assert all(cell for row in cells for cell in row)
    said = compare_peers.missing([onmt, fp32, fp16, broken], limits)
    assert said == [
        "nmt fp16: no % of limit (no cuda fp16 limit was measured in this run)",
        "nmt bf16: no greedy decoding (it crashed)",
        "nmt bf16: no beam5 decoding (it crashed)",
    ]
    with_gpu = {**limits, "cuda fp16": _limit("fp16", "cuda", 100_000.0)}
    assert "50.0% of cuda fp16" in compare_peers.table([fp16], None, with_gpu)
    assert compare_peers.missing([onmt, fp32, fp16], with_gpu) == []
    # a share just under a target is not rounded up to it (4,139 / 8,355 tokens/s)
    bf16 = Result("nmt bf16", 4_139.0, steps=919, precision="bf16")
    near = compare_peers.table([bf16], None, {"bf16": _limit("bf16", tokens_per_s=8_355.0)})
    assert "49.5% of bf16" in near


def test_decoding_again_another_way_replaces_the_models_rows(tmp_path):
    """`--redecode --decode-workers 2` over a run decoded without workers: the models decoded
    again lose their old rows (no stale decodings beside the new ones), the others stay."""
    old = [Result(name=n, tokens_per_s=1.0) for n in ("OpenNMT-py 3.5.1", "nmt fp32", "nmt bf16")]
    old[1].name += ", int8 decoding"
    out = tmp_path / "run.json"
    out.write_text(json.dumps({"limits": {}, "results": [asdict(r) for r in old]}))
    new = [Result(name="nmt fp32, int8 decoding, 2 decoding workers", tokens_per_s=1.0)]
    kept = kept_rows(new, out, "--redecode")
    assert [r.name for r in kept] == ["OpenNMT-py 3.5.1", "nmt bf16"]


def test_a_redecoded_run_says_how_its_run_trained_not_this_commands_flags(tmp_path, monkeypatch):
    """--redecode keeps a run's training figures, so its file keeps what that run trained
    with (minutes, updates, seed, turns, overrides, decay): decoding again a 1,000-update
    run of seed 19 whose rows took turns, with this command's defaults (4 minutes, seed 1, no
    turns), must not make runs.py and seeds.py read it as a one-after-another run of seed 1
    and a time budget."""
    row = Result("nmt fp32", 2000.0, steps=1000)
    run = {"limits": {"fp32": _LIMIT}, "results": [asdict(row)], "seed": 19, "updates": 1000}
    cpu = this_cpu()  # a run of another CPU is refused
    run |= {"minutes": 0.0, "interleave": 20.0, "cpu": cpu.name, "cpu_id": cpu.id}
    run["cpu_flags"] = list(cpu.flags)
    run |= {"nmt_set": ["train.schedule=step", "train.decay_start=800"], "decay": [800, 100, 0.5]}
    out = tmp_path / "run.json"
    out.write_text(json.dumps(run))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.en").write_text("a\n")

    def decoded_again(args, shared, only):  # nmt's adapter, its model decoded in a moment
        again = previous.previous_result(args, "nmt fp32")
        return [again], [
            Decoding(again, label, ["true"], re.compile("x"), list) for label, _ in DECODINGS
        ]

    adapter = argparse.Namespace(KEYS=("nmt-fp32",), run_all=decoded_again)
    monkeypatch.setattr(compare_peers, "ADAPTERS", [adapter])
    monkeypatch.setattr(compare_peers, "_shared_pieces", lambda *_: None)
    monkeypatch.setattr(compare_peers, "decode_in_turns", lambda *_: None)
    argv = ["compare_peers.py", "--data", str(tmp_path / "data"), "--work", str(tmp_path / "w")]
    monkeypatch.setattr(sys, "argv", [*argv, "--out", str(out), "--only", "nmt-fp32", "--redecode"])
    before = signal.getsignal(signal.SIGTERM)  # main's own handler, not the suite's after it
    try:
        compare_peers.main()
    finally:
        signal.signal(signal.SIGTERM, before)
    again = json.loads(out.read_text())
    assert again["redecoded"] is True
    assert (again["seed"], again["updates"], again["minutes"], again["interleave"]) == (
        19,
        1000,
        0.0,
        20.0,
    )
    assert again["results"][0]["tokens_per_s"] == 2000.0
    assert (again["nmt_set"], again["decay"]) == (run["nmt_set"], run["decay"])  # as it trained


def test_previous_limits_read_runs_written_before_gpus(tmp_path):
    """A run's JSON from before the device field (results/*.json) still gives its limits."""
    old = {"fp32": {"precision": "fp32", "tokens_per_s": 9554.0, "gflops": 453.0}}
    old["fp32"] |= {"mflop_per_token": 47.4, "products": 230, "library": "oneDNN 90%"}
    out = tmp_path / "run.json"
    out.write_text(json.dumps({"limits": old, "results": []}))
    limits = compare_peers.previous_limits(out, "--redecode", this_cpu())
    assert limits["fp32"].device == "cpu" and limits["fp32"].tokens_per_s == 9554.0


_LIMIT = {"precision": "fp32", "tokens_per_s": 1.0, "gflops": 1.0, "mflop_per_token": 1.0}
_LIMIT |= {"products": 1, "passes": [1.0, 2.0]}


@pytest.mark.parametrize(
    "run",
    [
        {"limits": {"fp32": {**_LIMIT, "speed": 1}}, "results": []},
        {"limits": {"fp32": 5}, "results": []},
        {"limits": [], "results": []},
        {"limits": {"fp32": {k: v for k, v in _LIMIT.items() if k != "gflops"}}, "results": []},
        {"limits": {}, "results": [{"tokens_per_s": 1.0}]},
        {"limits": {}, "results": ["nmt fp32"]},
        {"limits": {}, "results": {}},
        {"limits": {}, "results": [{"name": ["nmt fp32"]}]},
        {"limits": {}, "results": [{"name": "nmt fp32", "tokens_per_s": "fast"}]},
        {"limits": {}, "results": [{"name": "nmt fp32", "windows": [1.0, None]}]},
        {"limits": {}, "results": [{"name": "nmt fp32", "decode": {"greedy": 3}}]},
        {"limits": {"fp32": {**_LIMIT, "passes": ["fast"]}}, "results": []},
        {"limits": {"fp32": {**_LIMIT, "gflops": None}}, "results": []},
        {"limits": {}, "results": [], "seed": "1"},
        {"limits": {}, "results": [], "updates": -5},
        {"limits": {}, "results": [], "updates": True},
        {"limits": {}, "results": [], "cpu": "AMD EPYC", "cpu_flags": "avx2 fma"},
    ],
    ids=[
        "unknown field",
        "not a mapping",
        "limits a list",
        "a field missing",
        "no name",
        "a string",
        "results a mapping",
        "a name not text",
        "a speed not a number",
        "a window not a number",
        "a decoding not a mapping",
        "a pass not a number",
        "a rate null",
        "a seed not a number",
        "updates below 0",
        "updates a bool",
        "flags not a list",
    ],
)
def test_a_damaged_previous_run_is_one_line_for_each_reader(tmp_path, run):
    """--redecode reads the previous run's limits and rows: a damaged one is refused in one
    line naming the file, whichever of them reads it first (each once raised a TypeError)."""
    out = tmp_path / "run.json"
    out.write_text(json.dumps(run))
    limits = lambda o, f: compare_peers.previous_limits(o, f, this_cpu())  # noqa: E731
    for read in (limits, lambda o, f: kept_rows([], o, f)):
        says = f"--redecode: {out} is not a run compare_peers.py wrote"
        with pytest.raises(SystemExit, match=says):
            read(out, "--redecode")


ZEN4 = Cpu("AMD EPYC", "family 25, model 17", ("avx2", "fma", "avx512f", "avx512_bf16"))
ZEN4_NOW = dataclasses.replace(ZEN4, flags=(*ZEN4.flags, "avx512_vnni"))  # as named since s41


@pytest.mark.parametrize(
    "recorded, other",
    [
        (
            {"cpu": "AMD EPYC", "cpu_id": "family 25, model 17", "cpu_flags": list(ZEN4_NOW.flags)},
            False,
        ),
        ({"cpu": "AMD EPYC", "cpu_id": "family 26, model 2", "cpu_flags": list(ZEN4.flags)}, True),
        ({"cpu": "Intel(R) Xeon(R) Processor", "cpu_id": "family 25, model 17"}, True),
        ({"cpu": "AMD EPYC", "cpu_id": "family 25, model 17", "cpu_flags": ["avx2", "fma"]}, True),
        # runs before session 41: a name and seven flags, of which this CPU's VNNI is not one
        ({"cpu": "AMD EPYC", "cpu_flags": ["avx2", "fma", "avx512f", "avx512_bf16"]}, False),
        ({"cpu": "AMD EPYC", "cpu_flags": ["avx2", "fma"]}, True),
        ({"cpu": "Intel(R) Xeon(R) Processor", "cpu_flags": list(ZEN4.flags)}, True),
        ({}, False),  # a run that named no CPU: nothing to hold it against
    ],
    ids=[
        "same",
        "another model",
        "another name",
        "other flags",
        "older, same",
        "older, other flags",
        "older, another name",
        "no CPU named",
    ],
)
def test_decoding_again_refuses_a_run_measured_on_another_cpu(tmp_path, recorded, other):
    """--redecode keeps the previous run's training figures and limits and writes this
    machine's decodings beside them, under this machine's name: from another CPU (Zen 4 and
    Zen 5 both call themselves "AMD EPYC" under a hypervisor) that file would mix two
    machines. Refused in one line naming both."""
    out = tmp_path / "run.json"
    out.write_text(json.dumps({"limits": {"fp32": _LIMIT}, "results": [], **recorded}))
    here = ZEN4_NOW
    if other:
        says = f"--redecode: {out} was measured on {recorded['cpu']}"
        with pytest.raises(SystemExit, match=re.escape(says)) as refused:
            compare_peers.previous_limits(out, "--redecode", here)
        assert str(here) in str(refused.value) and "\n" not in str(refused.value)
    else:
        assert compare_peers.previous_limits(out, "--redecode", here)["fp32"].passes == [1.0, 2.0]


def test_a_previous_runs_limits_keep_their_passes(tmp_path):
    out = tmp_path / "run.json"
    out.write_text(json.dumps({"limits": {"fp32": _LIMIT}, "results": []}))
    assert compare_peers.previous_limits(out, "--redecode", this_cpu())["fp32"].passes == [1.0, 2.0]


@pytest.mark.parametrize(
    "args, says",
    [
        (["configs/nope.yaml"], "error: configs/nope.yaml: file not found"),
        (["README.md"], "error: README.md: line 3"),
        (["configs/tiny.yaml", "--vocab", "4"], "--vocab: '4': expected a whole number >= 5"),
        (["configs/tiny.yaml", "--src-len", "0"], "--src-len: '0': expected a whole number"),
        (["configs/tiny.yaml", "--precision", "fp16"], "fp16 is for GPUs"),
    ],
)
def test_limit_cli_refuses_bad_input_in_one_line(args, says):
    if "fp16" in args and torch.cuda.is_available():
        pytest.skip("fp16 is refused on CPU-only machines only")
    proc = subprocess.run(
        [sys.executable, "scripts/peers/limit.py", *args], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert says in proc.stderr.strip().splitlines()[-1], proc.stderr  # argparse's usage first


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU runs fp16")
def test_an_fp16_row_on_a_cpu_is_skipped_with_a_word(capsys):
    assert nmt_toolkit.run_all(argparse.Namespace(), None, {"nmt-fp16"}) == ([], [])  # type: ignore[arg-type]
    assert "nmt fp16: skipped: fp16 is for GPUs" in capsys.readouterr().out


def test_nmt_rows_decode_in_the_precision_asked_for(tmp_path, monkeypatch):
    """`--decode-precision bf16`: the fp32-trained model decodes with `--precision bf16` and
    its row says so; without it a row decodes in the precision it trained in."""
    monkeypatch.setattr(
        nmt_toolkit, "previous_result", lambda args, name: Result(name=name, tokens_per_s=1.0)
    )
    (tmp_path / "nmt-fp32").mkdir()
    (tmp_path / "nmt-fp32" / "last.pt").write_bytes(b"")  # decoded by a command, not here
    for asked, want, name in (
        (None, "fp32", "nmt fp32"),
        ("bf16", "bf16", "nmt fp32, bf16 decoding"),
    ):
        args = argparse.Namespace(int8=False, decode_precision=asked, curve=False, redecode=True)
        args.work = args.data = tmp_path
        args.decode_workers, args.decode_repeats = 1, 1
        (row,), decodings = nmt_toolkit.run_all(args, None, {"nmt-fp32"})  # type: ignore[arg-type]
        assert row.name == name
        assert [d.cmd[7] for d in decodings] == [want] * len(DECODINGS)
        assert [d.label for d in decodings] == [label for label, _ in DECODINGS]
        assert all(d.result is row for d in decodings)


def test_a_redecode_without_the_model_in_work_says_so_and_decodes_nothing(tmp_path, monkeypatch):
    """`--redecode` with a --work that does not hold the run's models: the row says where the
    model was looked for, as the peers' rows say "nothing decoded", and no decoding command
    runs (each once failed with the decoding process's traceback)."""
    monkeypatch.setattr(
        nmt_toolkit, "previous_result", lambda args, name: Result(name=name, tokens_per_s=1.0)
    )
    args = argparse.Namespace(int8=True, decode_precision=None, curve=False, redecode=True)
    args.work = args.data = tmp_path
    args.decode_workers, args.decode_repeats = 2, 1
    (row,), decodings = nmt_toolkit.run_all(args, None, {"nmt-fp32"})  # type: ignore[arg-type]
    assert decodings == []
    assert row.note == f"no model at {tmp_path / 'nmt-fp32' / 'last.pt'}: nothing decoded"
    assert compare_peers.missing([row], {})[1:] == [
        f"{row.name}: no {label} decoding ({row.note})" for label, _ in DECODINGS
    ]
    # and compare_peers.py stops there, the run it was to decode again left as it was
    out = tmp_path / "run.json"
    out.write_text(json.dumps({"limits": {}, "results": [asdict(row)]}))
    kept = out.read_bytes()
    monkeypatch.setattr(compare_peers, "ADAPTERS", [nmt_toolkit])
    monkeypatch.setattr(compare_peers, "_shared_pieces", lambda *_: None)
    monkeypatch.setattr(previous, "previous_result", lambda args, name: Result(name, 1.0))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.en").write_text("a\n")
    argv = ["compare_peers.py", "--data", str(tmp_path / "data"), "--work", str(tmp_path / "w")]
    argv += ["--out", str(out), "--only", "nmt-fp32", "--redecode"]
    monkeypatch.setattr(sys, "argv", argv)
    before = signal.getsignal(signal.SIGTERM)  # main's own handler, not the suite's after it
    try:
        with pytest.raises(SystemExit, match=r"^--redecode: nmt fp32: no model at .*as it was$"):
            compare_peers.main()
    finally:
        signal.signal(signal.SIGTERM, before)
    assert out.read_bytes() == kept


def test_decodings_run_in_turns_and_fill_their_rows(tmp_path, monkeypatch):
    """Every command's first run, then every one's second, ...; each row's cell holds the
    medians of its own seconds (what it printed) and of the whole command's, every own time,
    and the BLEU of what it wrote."""
    ran: list[str] = []
    said = {"a": iter(["took 3.0", "took 1.0", "took 2.0"]), "b": iter(["", "", ""])}

    def fake_sh(cmd, **kw):
        ran.append(cmd[0])
        return subprocess.CompletedProcess(cmd, 0, next(said[cmd[0]]), "")

    monkeypatch.setattr(common, "sh", fake_sh)
    monkeypatch.setattr(common, "scores", lambda hyps, data: {"bleu": float(len(hyps))})
    rows = [Result(name="one"), Result(name="two")]
    took = re.compile(r"took ([\d.]+)")
    decodings = [
        Decoding(rows[0], "greedy", ["a"], took, lambda: ["x", "y"]),
        Decoding(rows[1], "beam5", ["b"], took, lambda: ["x"]),
    ]
    decode_in_turns(decodings, 3, tmp_path)
    assert ran == ["a", "b", "a", "b", "a", "b"]
    one, two = rows[0].decode["greedy"], rows[1].decode["beam5"]
    assert one["seconds_all"] == [3.0, 1.0, 2.0] and one["seconds"] == 2.0
    assert one["bleu"] == 2.0 and two["bleu"] == 1.0
    assert two["seconds"] == two["command_s"] == statistics.median(two["seconds_all"])  # none said


@pytest.mark.parametrize(
    "args, says",
    [
        (["--int8", "--decode-precision", "bf16"], "--int8 and --decode-precision:"),
        (["--decode-precision", "fp16"], "--decode-precision: invalid choice: 'fp16'"),
        (["--minutes", "4", "--updates", "10"], "--updates: not allowed with argument --minutes"),
        (["--redecode", "--redecode-onmt"], "--redecode-onmt: not allowed with argument"),
        (["--decode-workers", str((os.cpu_count() or 1) + 1)], "CPU cores; expected at most"),
    ],
)
def test_compare_peers_refuses_contradicting_options(tmp_path, args, says):
    (tmp_path / "train.en").write_text("a\n")
    assert says in refusal(COMPARE_PEERS, "--data", str(tmp_path), *args)


@pytest.mark.parametrize(
    "args, says",
    [
        (["--work", "train.en"], "train.en: not a folder"),
        (["--work", "/proc/nmt-work"], "/proc/nmt-work: cannot make it a folder"),
        (["--nmt-config", "train.en"], "train.en: expected a mapping"),
        (["--nmt-config", "nope.yaml"], "nope.yaml: file not found"),
        (["--nmt-set", "model.nope=3"], "model.nope: unknown key"),
        (["--work", "mine"], "mine: a folder this script did not make, and not empty"),
    ],
)
def test_compare_peers_refuses_bad_paths_and_configs_before_running(tmp_path, args, says):
    """Before an hour of training, not after it, and in one line."""
    (tmp_path / "train.en").write_text("a\n")
    (tmp_path / "mine" / "onmt-run").mkdir(parents=True)  # a user's own OpenNMT-py run
    (tmp_path / "mine" / "onmt-run" / "notes.txt").write_text("mine\n")
    args = [str(tmp_path / a) if a in ("train.en", "nope.yaml", "mine") else a for a in args]
    assert says in refusal(COMPARE_PEERS, "--data", str(tmp_path), *args)
    assert (tmp_path / "mine" / "onmt-run" / "notes.txt").read_text() == "mine\n"


def test_compare_peers_fills_only_a_work_folder_of_its_own(tmp_path):
    """--work is new, empty, or one this script filled (its mark, or an earlier version's
    venvs and pieces): then it is marked as the script's, where it deletes and remakes its
    folders. A folder of the user's with anything in it is refused (above)."""
    earlier = tmp_path / "earlier"
    (earlier / "venv-onmt").mkdir(parents=True)
    (earlier / "venv-onmt" / ".installed").write_text("ok\n")
    (tmp_path / "empty").mkdir()
    for work in (tmp_path / "new" / "w", tmp_path / "empty", earlier):
        assert options.WORK.ours(work) == (work == earlier)
        args = argparse.Namespace(
            nmt_config=common.CONFIG, nmt_set=[], data=ROOT / "tests" / "data" / "tiny",
            out=tmp_path / "out.json", plot=None, work=work,
        )  # fmt: skip
        options.check_files(argparse.ArgumentParser(), args)
        assert options.WORK.ours(work)


# What the row had decoded at each pass of the limit's timings (`_one_fake_row`)
passes: list[dict] = []


def _one_fake_row(tmp_path, monkeypatch, *, cut_short: bool) -> Result:
    """compare_peers.main with one row that "trained" and one decoding of it, nothing run:
    the decoding fills its cell, or stops the run as a time limit would (`cut_short`)."""
    passes.clear()
    (tmp_path / "train.en").write_text("a\n")
    row = Result(name="nmt fp32", tokens_per_s=1000.0)
    said = re.compile(r"took ([\d.]+)")
    adapter = argparse.Namespace(
        KEYS=["nmt-fp32"],
        run_all=lambda *_: ([row], [Decoding(row, "greedy", ["x"], said, lambda: ["y"])]),
    )

    def decode(decodings, times, data):
        if cut_short:
            sys.exit("compare_peers.py: terminated")
        for d in decodings:
            d.result.decode[d.label] = {"seconds": 1.0, "bleu": 2.0, "bleu_wmt_mmt": 2.0}

    monkeypatch.setattr(compare_peers, "ADAPTERS", [adapter])
    monkeypatch.setattr(compare_peers, "limit_pass", lambda *_: passes.append(row.decode.copy()))
    monkeypatch.setattr(compare_peers, "_shared_pieces", lambda *_: None)
    monkeypatch.setattr(compare_peers, "decode_in_turns", decode)
    return row


def _main(tmp_path, monkeypatch, out, *, cut_short: bool) -> None:
    argv = ["compare_peers.py", "--data", str(tmp_path), "--work", str(tmp_path / "w")]
    monkeypatch.setattr(sys, "argv", [*argv, "--out", str(out), "--only", "nmt-fp32"])
    before = signal.getsignal(signal.SIGTERM)  # main's own handler, not the suite's after it
    try:
        if cut_short:
            with pytest.raises(SystemExit, match="terminated"):
                compare_peers.main()
        else:
            compare_peers.main()
    finally:
        signal.signal(signal.SIGTERM, before)


@pytest.mark.parametrize("cut_short", [False, True], ids=["whole", "cut while decoding"])
def test_the_training_figures_are_written_before_the_decodings(tmp_path, monkeypatch, cut_short):
    """--out holds the rows once they have trained, their decoding cells empty, so that a run
    stopped while decoding (a time limit: the first bench of session 33's GPU) keeps them
    for --redecode; then the whole run."""
    row = _one_fake_row(tmp_path, monkeypatch, cut_short=cut_short)
    out = tmp_path / "out.json"
    _main(tmp_path, monkeypatch, out, cut_short=cut_short)
    run = json.loads(out.read_text())
    (written,) = run["results"]
    assert written["tokens_per_s"] == 1000.0 and run["decoded"] is not cut_short
    assert written["decode"] == ({} if cut_short else {"greedy": row.decode["greedy"]})
    # the machine as written is the machine as read back (`--redecode`'s check of it)
    assert previous.previous_run(out, "--redecode").cpu == this_cpu()
    assert run["cpu_id"] == this_cpu().id


def test_the_limit_is_timed_before_the_rows_train_and_after_them(tmp_path, monkeypatch):
    """A pass of the limit's timings before the first row trains and one after each
    toolkit's rows (here one), both before any decoding."""
    _one_fake_row(tmp_path, monkeypatch, cut_short=False)
    _main(tmp_path, monkeypatch, tmp_path / "out.json", cut_short=False)
    assert passes == [{}, {}]


def _timings(seconds: dict[Product, float], rate: float) -> Timings:
    seen = collections.Counter(dict.fromkeys(seconds, 2))
    best = {p: (t, "torch") for p, t in seconds.items()}
    return Timings("fp32", "cpu", seen, 100, best, (rate,))


def test_passes_of_the_limit_keep_each_products_fastest_timing():
    """Noise only slows a product: merged passes keep each product's fastest timing (here
    one from each pass), and the limit says each pass's own rate."""
    a, b = Product("mm", 1, 64, 512, 1536), Product("bmm", 64, 1, 16, 512)
    slow_a = _timings({a: 3.0, b: 1.0}, 10.0)
    slow_b = _timings({a: 1.0, b: 5.0}, 20.0)
    both = slow_a.merged(slow_b)
    assert both.best == {a: (1.0, "torch"), b: (1.0, "torch")}
    lim = both.limit()
    assert lim.passes == [10.0, 20.0] and lim.tokens_per_s == pytest.approx(100 / 4.0)
    assert lim.tokens_per_s > max(slow_a.limit().tokens_per_s, slow_b.limit().tokens_per_s)


def test_a_pass_rate_is_its_own_limits_rate(tmp_path, one_round):
    """One pass of real timings: its recorded rate is the rate of the limit it alone gives."""
    timed = time_step(tiny(tmp_path), "fp32", vocab=37, src_len=5, tgt_len=4)
    lim = timed.limit()
    assert lim.passes == [pytest.approx(lim.gflops)]


def test_a_stream_gets_the_run_once(tmp_path, monkeypatch, capsys):
    """--out naming a stream (/dev/stdout; here /dev/null) is written at the end only: a
    reader of it gets one JSON document."""
    _one_fake_row(tmp_path, monkeypatch, cut_short=True)
    _main(tmp_path, monkeypatch, os.devnull, cut_short=True)
    assert "before the decodings" not in capsys.readouterr().out


@pytest.mark.parametrize("when", ["while it starts", "while it runs"])
def test_ctrl_c_ends_the_peer_a_run_started(tmp_path, when):
    """A training `run` started (OpenNMT-py's, in a session of its own so that Ctrl-C reaches
    it only through `run`) ends with the script, however early the Ctrl-C: one while it
    started used to leave it running, competing with whatever ran next."""
    code = (
        "from pathlib import Path\nfrom peers import common\n"
        + ("common._wait = interrupt\n" if when == "while it runs" else "")
        + f"common.run(['sleep', '30'], log=Path({str(tmp_path / 'log')!r}))\n"
    )
    assert interrupted_start(str(ROOT / "scripts"), code, when) == "ended\n"


def test_a_run_ends_its_peer_with_sigint_even_when_this_script_ignores_it(tmp_path):
    """Started as `nohup compare_peers.py ... &` from a shell script, the script has SIGINT
    ignored, and its children inherited that: the SIGINT that ends a peer's budget did
    nothing, the peer trained on until killed 2 minutes later, and Joey NMT (which writes its
    checkpoint on that SIGINT) left nothing to decode. The peer here writes a file on
    KeyboardInterrupt, as Joey writes its checkpoint."""
    said = tmp_path / "interrupted"
    peer = (
        "import time\ntry:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n"
        f"    open({str(said)!r}, 'w').write('saved')\n"
    )
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        started = time.monotonic()
        common.run([sys.executable, "-c", peer], log=tmp_path / "log", minutes=1 / 60)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert said.read_text() == "saved" and time.monotonic() - started < 30


@pytest.mark.parametrize("content", [b"not json", b"\xff\xfebad", b"[1, 2]"])
def test_a_redecode_of_a_damaged_run_makes_no_work_folder(tmp_path, monkeypatch, content):
    """--redecode reads the run it decodes again before it makes --work: a file that is not
    such a run is one line, with --work not made and the file left as it was."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.en").write_text("a\n")
    out = tmp_path / "run.json"
    out.write_bytes(content)
    work = tmp_path / "w"
    argv = ["compare_peers.py", "--data", str(tmp_path / "data"), "--work", str(work)]
    monkeypatch.setattr(sys, "argv", [*argv, "--out", str(out), "--redecode"])
    with pytest.raises(SystemExit, match=r"^--redecode: .*run\.json is not a run compare_peers"):
        compare_peers.main()
    assert not work.exists() and out.read_bytes() == content
