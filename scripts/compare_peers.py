"""nmt against OpenNMT-py and Joey NMT: the same model, data and machine, in one run.

Each toolkit trains the reference model (configs/reference_rnn.yaml: embeddings 256, a
bidirectional GRU 256 per direction, an input-feeding GRU decoder 512 with mlp/concat
attention, an untied 512 x 8,000 output layer, 64 sentences a batch, Adam 1e-3, clip 5,
dropout 0.2) for the same number of minutes on Multi30k en->fr, one after the other, all on
one joint sentencepiece model (nmt's, trained once by `nmt prepare`). Then each decodes
test_2016_flickr greedily and with beam 5 from its last checkpoint. One table, with ratios
to OpenNMT-py, is printed and written as JSON.

    .venv/bin/python scripts/compare_peers.py --minutes 4 --data ../shared/data/multi30k

`--updates N` trains each for N updates instead, with no time budget, and decodes the
step-N checkpoints: models equally far along, so that decoding times and BLEU compare (the
minutes are each toolkit's own; Joey NMT's adapter has a time budget only and is left out):

    .venv/bin/python scripts/compare_peers.py --updates 1000 --only opennmt-py,nmt-fp32

Learning curves (BLEU against minutes): `--curve N` has nmt validate every N updates (its
greedy validation BLEU, the minutes it was reached at, validation time included as in any
nmt run) and OpenNMT-py save a checkpoint every N steps (validating every 500 as usual),
each decoded greedily on the validation set afterwards. `--plot FILE.png` draws them;
`--nmt-config` trains another nmt config than the reference model (the peers keep theirs):

    .venv/bin/python scripts/compare_peers.py --minutes 15 --only nmt-fp32,opennmt-py \
        --nmt-config configs/multi30k_en_fr.yaml --curve 250 --plot docs/curve.png

`--decay START,EVERY,FACTOR` (OpenNMT-py's start_decay_steps, decay_steps,
learning_rate_decay; nmt's `train.schedule: step`) and `--smoothing FACTOR` (`average_decay`;
`train.exponential_smoothing`) train both toolkits alike, Joey NMT's row left out.

Training speed is target tokens/s (non-pad, EOS included) as each toolkit logs it per log
window, the median of the windows after the first (which holds start-up). Each row also
gives its share of the machine's own limit for the model (`peers/limit.py`: the tokens/s
its matrix products alone would allow, at the model's shapes, in the row's precision,
measured in the same run: before the first row trains and after each toolkit's rows, each
product's fastest timing kept, each pass's own figure in the JSON), with the CPU's model name,
family and model numbers and flags in the output and JSON.
`--interleave SECONDS` trains every row at once, taking turns of SECONDS (`peers/turns.py`:
the others stopped meanwhile), so that all meet the same slow spells of a shared CPU, which
last minutes: one after the other, each row met its own. Each row's --minutes are then its
own running ones and its tokens/s that of the windows that lie inside one of its turns
(their tokens over their seconds); the output adds how each row's tokens/s and its ratio
to OpenNMT-py moved over the cycles of turns.
On a GPU, nmt's rows train there and are measured against the GPU's own limit in their
precision ("cuda fp16"); the peers still train on the CPU, against its fp32 limit.
Peak memory is the training process's peak resident set (`wait4`). Decoding times are the
toolkits' own translation time (model loading excluded) and the whole command's, each a
fresh process as a user runs it, after every row has trained; `--decode-repeats N` runs each
command N times, the rows in turns (every command's first run, then every one's second: the
machine's drift falls on all rows alike), and reports the medians (one cold run moves by
±20 % here), and `--redecode` decodes the previous run's models again without training (its
training figures and limits kept from --out, and what it trained with: minutes, updates, seed,
turns, overrides, decay, smoothing). --out is written once all rows have trained,
their decoding cells empty, and again once they have decoded: a run stopped while decoding
(a time limit) keeps its training figures, and `--redecode` fills the cells.
`--int8`, `--decode-precision P` and `--decode-workers N` decode nmt's rows as `nmt
translate --int8 --precision P --workers N` would (int8 weights; P instead of the precision
each row trained in; N worker processes of cores / N threads each), the peers as they do by
default (OpenNMT-py: one process, torch's threads). BLEU is sacrebleu's on detokenized
(sentencepiece-decoded) output against the raw references.

The peers are installed, once, into their own virtual environments under --work (default
~/.cache/nmt-peers, outside the repository), with the torch of this environment's version.
The script deletes and remakes its own folders there (each toolkit's run, the shared
pieces), so --work is a new or empty folder, or one it made (marked): another is refused.
Each toolkit is an adapter in scripts/peers/ (install, train, read its log, decode); this
file runs them and prints the table. A cell left empty is said why below the table.
Nothing else runs meanwhile: two jobs on a small machine make both figures wrong.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import signal
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import argtypes  # noqa: E402
from peers import ADAPTERS, joey, opennmt  # noqa: E402
from peers.common import (  # noqa: E402
    CONFIG,
    DECODINGS,
    ROOT,
    Decoding,
    Result,
    Shared,
    decode_in_turns,
    encode_pieces,
    sh,
    share_of_limit,
    shared_of,
    turn_rates,
)
from peers.limit import Cpu, Limit, Timings, limit_key, this_cpu, timed_pass  # noqa: E402
from peers.options import (  # noqa: E402
    check_decoding,
    check_files,
    check_training,
    decoding_arguments,
    nmt_config,
    training_arguments,
)
from peers.previous import check_redecoded, kept_rows, previous_run  # noqa: E402
from peers.report import Report, plot  # noqa: E402
from peers.turns import same_spells, taking_turns, together  # noqa: E402

from nmt.run_dir import OWNER_MARK  # noqa: E402
from nmt.runtime import cpu_has_bf16_matmul  # noqa: E402


def table(results: list[Result], base: Result | None, limits: dict[str, Limit]) -> str:
    def ratio(value: float, ref: float | None, inverse: bool = False) -> str:
        if not ref or not value:
            return ""
        r = ref / value if inverse else value / ref
        return f" ({r:.2f}x)"

    lines = [
        "| | target tokens/s (x OpenNMT-py) | % of limit | peak RSS GB | steps | greedy s (x) "
        "| greedy BLEU | beam 5 s (x) | beam 5 BLEU |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if not r.tokens_per_s:  # no window to read a speed from: said why by `missing`
            cells = [r.name, "-"]
            share = None
        else:
            cells = [
                r.name,
                f"{r.tokens_per_s:,.0f}" + ratio(r.tokens_per_s, base and base.tokens_per_s),
            ]
            share = share_of_limit(r, limits)
        # one decimal: 49.5 % of a limit is not the target's 50 % (session 41's run read "50%")
        cells.append("-" if share is None else f"{share:.1%} of {limit_key(r.precision, r.device)}")
        cells += [f"{r.peak_rss_gb:.2f}", str(r.steps)]
        for label in ("greedy", "beam5"):
            d = r.decode.get(label)
            ref = base.decode.get(label) if base else None
            if d:
                cells.append(
                    f"{d['seconds']:.1f}"
                    + ratio(d["seconds"], ref and ref["seconds"], inverse=True)
                )
                cells.append(f"{d['bleu']:.1f}")
            else:
                cells += ["-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def limit_pass(args: argparse.Namespace, only: set[str], timings: dict[str, Timings]) -> None:
    """A pass of the limit's timings (`peers.limit.timed_pass`), before the first row trains
    and after each toolkit's rows: one pass in a slow spell of a shared CPU gave half the bf16
    limit. On the CPU fp32 (the peers' rows too), and bf16 where the CPU has bf16 units; on a
    GPU, where nmt's rows train, each precision asked for (`--only nmt-fp16` ...)."""
    cfg = nmt_config(args)
    gpu_here = torch.cuda.is_available()
    cpu = ["fp32"] + (["bf16"] if cpu_has_bf16_matmul() and not gpu_here else [])
    wanted = [(torch.device("cpu"), p) for p in cpu]
    if gpu_here:
        gpu = [p for p in ("fp32", "bf16", "fp16") if f"nmt-{p}" in only]
        wanted += [(torch.device("cuda"), p) for p in gpu]
    timed_pass(cfg, wanted, timings)


def previous_limits(out: Path, flag: str, here: Cpu) -> dict[str, Limit]:
    """The limits measured by the run in `out` (decoding again, as `flag` asks, keeps its
    training figures, so their share of the limit is taken against the limit measured
    beside them). Refused where that run measured another CPU: its file would hold one
    machine's training and limits, another's decodings, and name only this one."""
    run = previous_run(out, flag)
    if run.cpu is not None and run.cpu.differs(here):
        raise SystemExit(
            f"{flag}: {out} was measured on {run.cpu}, and this is {here}: decode it again "
            f"on that machine, or train anew here (without {flag}) to another --out"
        )
    limits = run.limits
    for precision, lim in limits.items():
        print(f"limit {precision}: {lim.tokens_per_s:,.0f} tok/s, measured by the run in {out}")
    return limits


def missing(results: list[Result], limits: dict[str, Limit]) -> list[str]:
    """Why a row's cells are empty (its speed, its share of a limit, its decodings): never
    silently."""
    lines = []
    for r in results:
        if not r.tokens_per_s:
            where = " inside one of its turns, after the turn's first," if r.turns else ""
            lines.append(f"{r.name}: no tokens/s (no log window{where} to read them from)")
        key = limit_key(r.precision, r.device)
        if key not in limits:
            lines.append(f"{r.name}: no % of limit (no {key} limit was measured in this run)")
        lines += [
            f"{r.name}: no {label} decoding ({r.note or 'no reason recorded'})"
            for label, _ in DECODINGS
            if label not in r.decode
        ]
    return lines


def _train_rows(
    args: argparse.Namespace, shared: Shared, only: set[str], timings: dict[str, Timings]
) -> list[tuple[list[Result], list[Decoding]]]:
    """Each adapter's rows and timed decodings: trained one after the other, with a pass of
    the limit after each toolkit's rows; or, under --interleave, all at once taking turns,
    with as many passes after them all. Why as many: on the Zen 5 a pass's bf16 limit fell
    near 750 or near 880 GFLOP/s from one pass to the next, and an interleaved run that took
    two passes, both near 750, read its limit 14 % below the check's four (session 50)."""
    if not args.interleave:
        found = []
        for adapter in ADAPTERS:
            found.append(adapter.run_all(args, shared, only))
            if found[-1][0] and not args.again:
                limit_pass(args, only, timings)
        return found
    with taking_turns(args.interleave) as args.turns:
        found = together([functools.partial(a.run_all, args, shared, only) for a in ADAPTERS])
    args.turns = None
    for _ in range(max(1, sum(bool(rows) for rows, _ in found))):
        limit_pass(args, only, timings)
    return found


def _arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    budget = ap.add_mutually_exclusive_group()  # a time or a number of updates, not both
    budget.add_argument(
        "--minutes", type=argtypes.minutes, default=4.0, help="training time of each"
    )
    budget.add_argument(
        "--updates",
        type=argtypes.whole(1),
        default=0,
        help="train each for this many updates instead of --minutes (no time budget)",
    )
    ap.add_argument(
        "--seed",
        type=argtypes.whole(1),  # OpenNMT-py seeds nothing below 1
        default=1,
        help="every toolkit's random seed (initialisation, batch order, dropout): a second "
        "seed shows how far BLEU moves by chance",
    )
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "multi30k")
    ap.add_argument("--work", type=Path, default=Path.home() / ".cache" / "nmt-peers")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "compare_peers.json")
    ap.add_argument("--log-every", type=argtypes.whole(1), default=25)
    ap.add_argument("--nmt-config", type=Path, default=CONFIG, help="the config nmt trains")
    ap.add_argument(
        "--nmt-set", action="append", default=[], metavar="KEY=VALUE", help="nmt override"
    )
    ap.add_argument(
        "--curve", type=argtypes.whole(1), default=0, help="learning curve: a point every N updates"
    )
    ap.add_argument("--plot", type=Path, help="draw the learning curves to FILE.png")
    ap.add_argument(
        "--interleave",
        type=argtypes.above_zero("seconds"),
        default=0.0,
        metavar="SECONDS",
        help="train every row at once, taking turns of SECONDS (the others stopped), so all "
        "meet the same slow spells of a shared CPU; --minutes are each row's running ones",
    )
    training_arguments(ap)
    decoding_arguments(ap)
    ap.add_argument(
        "--only",
        type=argtypes.some_of(key for adapter in ADAPTERS for key in adapter.KEYS),
        default="nmt-fp32,nmt-bf16,nmt-fp16,opennmt-py,joeynmt",
        help="comma-separated: nmt-fp32, nmt-bf16, nmt-fp16 (GPU), opennmt-py, joeynmt",
    )
    args = ap.parse_args()
    args.data, args.work = args.data.resolve(), args.work.resolve()
    # decoding again, no training: the flag that asked for it ("" when training)
    args.again = "--redecode" if args.redecode else "--redecode-onmt" if args.redecode_onmt else ""
    if not (args.data / "train.en").is_file():
        ap.error(f"--data {args.data}: no train.en there; expected Multi30k's files")
    check_decoding(ap, args)
    check_training(ap, args)
    if args.interleave and args.again:
        ap.error(f"--interleave and {args.again}: {args.again} trains nothing")
    if args.interleave and args.curve:  # the points' minutes are nmt's own, by the clock
        ap.error("--interleave and --curve: a curve's minutes run on while its row waits a turn")
    args.turns = None  # the rotation (peers.turns) while the rows train at once
    # the run to decode again, read (a damaged one refused) before --work is made
    args.previous = previous_limits(args.out, args.again, this_cpu()) if args.again else {}
    check_files(ap, args)
    return args


def _shared_pieces(args: argparse.Namespace) -> Shared:
    """One sentencepiece model for all: nmt's tokenizer, trained once, and the corpus in its
    pieces. A folder this script made with an nmt that did not mark its runs (or a prepare
    cut short) is started again."""
    shared = shared_of(args.work)
    spm_run = shared.spm_model.parent  # the run `nmt prepare` makes
    if spm_run.is_dir() and not (spm_run / OWNER_MARK).is_file():
        shutil.rmtree(spm_run)
    sh(
        [
            sys.executable,
            "-m",
            "nmt",
            "prepare",
            str(CONFIG),
            "--set",
            f"data.dir={args.data}",
            "--set",
            f"run.dir={spm_run}",
        ]
    )
    encode_pieces(shared.spm_model, args.data, shared.pieces)
    return shared


def main() -> None:
    args = _arguments()
    # SIGTERM (a timeout, kill) as an exception: the training under way is killed with us
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("compare_peers.py: terminated"))
    only = set(args.only)
    if args.updates:
        args.minutes = 0.0  # every adapter reads 0 as "no time budget"
        if only & set(joey.KEYS):
            print(f"{joey.NAME}: left out: its adapter trains for --minutes only")
            only -= set(joey.KEYS)
    threads = torch.get_num_threads()
    cpu = this_cpu()
    budget = f"{args.updates} updates" if args.updates else f"{args.minutes} min"
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    print(
        f"{cpu}; {threads} threads, torch "
        f"{torch.__version__}, {budget} each, seed {args.seed}; work in {args.work}"
        + (f"; GPU: {gpu} (nmt's rows train there, the peers on the CPU)" if gpu else "")
    )
    timings: dict[str, Timings] = {}
    if not args.again:
        limit_pass(args, only, timings)
    shared = _shared_pieces(args)
    results, decodings = [], []
    for rows, timed in _train_rows(args, shared, only, timings):
        results += rows
        decodings += timed
    if not results:
        sys.exit("compare_peers.py: no row ran on this machine (said why above); nothing written")
    if args.again:
        check_redecoded(results, decodings, args)
    # --redecode keeps its run's limits; else those of the passes before and between the rows
    limits = args.previous if args.again else {key: t.limit() for key, t in timings.items()}
    trained = previous_run(args.out, args.again) if args.again else None
    report = Report(args, threads, cpu, gpu, limits, trained)
    if decodings:
        # the training figures kept if the decodings are cut short; not twice into a stream
        # (--out /dev/stdout), nor over the run that --redecode reads
        if not args.again and (args.out.is_file() or not args.out.exists()):
            report.write(results, decoded=False)
            print(f"written, before the decodings (--redecode runs them again): {args.out}")
        runs = f"{args.decode_repeats} run{'s' if args.decode_repeats > 1 else ''}"
        print(f"decoding {len(decodings)} commands, {runs} each, in turns ...", flush=True)
        decode_in_turns(decodings, args.decode_repeats, args.data)
    base = next((r for r in results if r.name == opennmt.NAME), None)

    if args.again:
        results += kept_rows(results, args.out, args.again)
    print()
    print(table(results, base, limits))
    for line in missing(results, limits):
        print(line)
    if base is None and any(r.name == opennmt.NAME for r in results):
        print(
            f"no ratios: {opennmt.NAME}'s row is the previous run's, decoded then; "
            "add opennmt-py to --only to decode it again beside the others"
        )
    for r in results:
        for label, d in r.decode.items():
            print(f"{r.name} {label}: test BLEU {d['bleu']:.1f}, wmt-mmt {d['bleu_wmt_mmt']:.1f}")
    if args.interleave and base is not None:
        print(f"\nturns of {args.interleave:g} s, each paired with {base.name}'s nearest in time:")
        for r in results:
            if r is not base:
                print(same_spells(r.name, turn_rates(base), turn_rates(r)))
    if args.plot:
        plot(results, args.plot, args.minutes)
        print(f"curve: {args.plot}")
    report.write(results, decoded=True)
    print(f"\nwritten: {args.out}")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # the training under way was killed with us (`peers.common.run`)
        sys.exit("compare_peers.py: interrupted")
