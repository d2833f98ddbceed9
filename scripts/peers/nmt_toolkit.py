"""nmt itself, once per precision: fp32, bf16 where the CPU has bf16 matrix units (or a GPU
runs it), fp16 on a GPU. Trained with `nmt train` on the reference config, decoded with
`Translator` from the checkpoint it stopped at (a curve run: what nmt would translate with),
in the precision it trained in (`--decode-precision`: in that one); under `--int8` with int8
weights and its float parts in fp32 (`nmt translate --int8`'s default): with every large
product in int8, bf16 autocast only
adds casts (session 19, validation, bf16-trained model: greedy 0.82 s against 0.93, beam 5
2.60 against 2.71, `scripts/bench_translate.py --variants int8,int8+bf16`); under
`--decode-workers N` in N worker processes (`nmt.workers`).
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
from pathlib import Path

import torch

from nmt.files import read_lines
from nmt.report import read_metrics
from nmt.run_dir import LAST_NAME
from nmt.runtime import cpu_has_bf16_matmul
from peers.common import (
    DECODINGS,
    TEST,
    Decoding,
    Result,
    Shared,
    median_after_first,
    run,
    timed_by_turns,
)
from peers.previous import previous_result
from peers.turns import together

KEYS = ("nmt-fp32", "nmt-bf16", "nmt-fp16")


def run_all(
    args: argparse.Namespace, shared: Shared, only: set[str]
) -> tuple[list[Result], list[Decoding]]:
    """Each precision asked for (`--only`) that this machine runs, trained (or the previous
    run's, `--redecode`; all at once, taking turns, under --interleave), and their timed
    decodings."""
    precisions = _runnable([p for p in ("fp32", "bf16", "fp16") if f"nmt-{p}" in only])
    if not precisions:
        return [], []
    if args.redecode:  # the previous run's models, decoded again (any way they were before)
        trained = [previous_result(args, f"nmt {p}") for p in precisions]
        for r, p in zip(trained, precisions, strict=True):
            r.name = f"nmt {p}"
    else:
        jobs = [functools.partial(_train, p, args, shared) for p in precisions]
        trained = together(jobs) if args.turns else [job() for job in jobs]
    results: list[Result] = []
    decodings: list[Decoding] = []
    for r, precision in zip(trained, precisions, strict=True):
        run_dir = args.work / f"nmt-{precision}"
        # int8 keeps its float parts in fp32 (see above); --decode-precision is not int8's
        decode_in = "fp32" if args.int8 else args.decode_precision or precision
        suffix = ", int8 decoding" if args.int8 else ""
        if decode_in != precision and not args.int8:
            suffix += f", {decode_in} decoding"
        if args.decode_workers > 1:
            suffix += f", {args.decode_workers} decoding workers"
        # the timed speed run decodes where it stopped; a curve run (validating as nmt does)
        # decodes what nmt would translate with (averaged, else best)
        model = run_dir if args.curve else run_dir / LAST_NAME
        if model.exists():
            decodings += nmt_decode(r, model, decode_in, args)
        else:  # --redecode with a --work that does not hold the run: said, as the peers say it
            r.note = f"no model at {model}: nothing decoded"
        r.name += suffix
        results.append(r)
        print(f"  {r.name}: {r.tokens_per_s:,.0f} tok/s", flush=True)
    return results, decodings


def _runnable(precisions: list[str]) -> list[str]:
    """Those of `precisions` this machine runs (why not, said for each of the others)."""
    gpu = torch.cuda.is_available()  # nmt trains and decodes there (device auto)
    kept = []
    for precision in precisions:
        if precision == "fp16" and not gpu:
            print("nmt fp16: skipped: fp16 is for GPUs, and torch sees none on this machine")
        elif precision == "bf16" and not gpu and not cpu_has_bf16_matmul():
            print(
                "nmt bf16: skipped: this CPU has no bf16 matrix units (AVX512-BF16 or AMX), "
                "so bf16 products are emulated, 1-2 GFLOP/s against fp32's ~100"
            )
        else:
            kept.append(precision)
    return kept


def _train(precision: str, args: argparse.Namespace, shared: Shared) -> Result:
    """nmt trained in `precision`, its sentencepiece model checked against the shared one."""
    name, run_dir = f"nmt-{precision}", args.work / f"nmt-{precision}"
    print(f"training {name} ...", flush=True)
    r = nmt_train(f"nmt {precision}", precision, args, run_dir)
    same = (run_dir / "spm.model").read_bytes() == shared.spm_model.read_bytes()
    r.note = "same sentencepiece model" if same else "sentencepiece model differs!"
    if args.updates and r.steps != args.updates:
        r.note += f"; stopped at step {r.steps}, not the {args.updates} asked for!"
    return r


def nmt_train(name: str, precision: str, args: argparse.Namespace, run_dir: Path) -> Result:
    nmt = [sys.executable, "-m", "nmt"]
    # --updates: that many and no time budget; else the minutes, nmt's own (by the clock), or
    # its running ones counted here where it takes turns with others (--interleave); there
    # nmt's clock only backs them up (nmt trains to some budget of its own)
    own_minutes = args.minutes and not args.turns
    clock = args.minutes if own_minutes else args.minutes * 100 if args.minutes else "null"
    sets = [
        f"data.dir={args.data}",
        f"run.dir={run_dir}",
        f"train.precision={precision}",
        f"train.seed={args.seed}",
        f"train.max_minutes={clock}",
        f"train.max_steps={args.updates}",
        "train.max_epochs=0",
        f"train.log_every={args.log_every}",
        # no validation inside the timed run, unless a learning curve is wanted
        f"train.valid_every={args.curve or 1000000}",
        "run.tensorboard=false",
        "run.link_latest=false",  # the user's runs/latest stays on the user's own model
        *args.nmt_set,
    ]
    config = args.nmt_config
    cmd = [*nmt, "train", str(config), "--overwrite"] + [a for s in sets for a in ("--set", s)]
    log = args.work / f"{name}.train.log"
    rss = run(cmd, log=log, minutes=0 if own_minutes else args.minutes, turns=args.turns)
    rows = read_metrics(run_dir)
    timed = [r for r in rows if "tokens_per_s" in r]
    windows = [r["tokens_per_s"] for r in timed]
    steps = max((r["step"] for r in rows if "step" in r), default=0)
    curve = [
        {"minutes": r["minutes"], "step": r["step"], "val_bleu": r["val_bleu"]}
        for r in rows
        if "val_bleu" in r
    ]
    result = Result(
        name,
        median_after_first(windows),
        windows,
        rss / 2**30,
        steps,
        curve=curve,
        precision=precision,
        device="cuda" if torch.cuda.is_available() else "cpu",  # where `device: auto` trains
    )
    return timed_by_turns(result, [r.get("time") for r in timed], args.turns, log)


NMT_DECODE = """
import json, sys, time
from nmt.translate import Translator
model, src, out, beam, precision, int8, workers = sys.argv[1:8]
tr = Translator.from_checkpoint(
    model, "auto", precision=precision, int8=int8 == "int8", workers=int(workers)
)
lines = open(src, encoding="utf-8").read().splitlines()
start = time.perf_counter()
hyps = tr.translate(lines, beam=int(beam), batch_size=64)
seconds = time.perf_counter() - start
open(out, "w", encoding="utf-8").write("".join(h.text + "\\n" for h in hyps))
print(json.dumps({"seconds": seconds}))
"""


DECODE_TIME = re.compile(r'"seconds": ([\d.eE+-]+)')  # what NMT_DECODE prints


def nmt_decode(
    result: Result, model: Path, precision: str, args: argparse.Namespace
) -> list[Decoding]:
    """`result`'s model (a checkpoint or a run folder) decoded with each of DECODINGS, in
    `precision` (int8 under --int8): the timed decodings, for `decode_in_turns`."""
    decodings = []
    for label, beam in DECODINGS:
        out = args.work / f"{result.name}.{label}.hyp"
        cmd = [
            sys.executable,
            "-c",
            NMT_DECODE,
            str(model),
            str(args.data / f"{TEST}.en"),
            str(out),
            str(beam),
            precision,
            "int8" if args.int8 else "float",
            str(args.decode_workers),
        ]
        hyps = functools.partial(read_lines, out)
        decodings.append(Decoding(result, label, cmd, DECODE_TIME, hyps))
    return decodings
