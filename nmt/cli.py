"""The `nmt` command line: each command parses its options and calls one library function.

Heavy libraries (torch, datasets) are imported inside the commands that need them, so
`nmt --help` and `nmt check-config` answer at once. Mistakes a user can fix (`NmtError`)
become one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import contextlib
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from nmt.batcher import Limits
from nmt.config import Config, ConfigError, load_config
from nmt.errors import NmtError

if TYPE_CHECKING:
    from nmt.translate import Translation, Translator

app = typer.Typer(
    name="nmt",
    help="Neural machine translation: one YAML file gives a tokenizer, a trained model, "
    "translations and a BLEU score.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

ConfigArg = Annotated[
    Path, typer.Argument(help="YAML config file, e.g. configs/multi30k_en_fr.yaml")
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        help="Override a config key, type-checked like the file: --set train.lr=0.0005 "
        "(repeatable).",
        metavar="KEY=VALUE",
    ),
]


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


@app.callback()
def main(
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            help="Show the full traceback of an error (also: NMT_DEBUG=1).",
            envvar="NMT_DEBUG",
        ),
    ] = False,
) -> None:
    """Neural machine translation: one YAML file gives a tokenizer, a trained model,
    translations and a BLEU score."""
    global _debug
    _debug = debug


_debug = False


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Mistakes a user can fix become one line each on stderr and exit code 2 (with
    `--debug`, the traceback too); Ctrl-C outside training exits 130."""
    try:
        yield
    except NmtError as e:
        if _debug:
            traceback.print_exc()
        lines = [f"{e.source}: {p}" for p in e.problems] if isinstance(e, ConfigError) else [str(e)]
        for line in lines:
            typer.echo(f"error: {line}", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        raise typer.Exit(130) from None


def _load(config: Path, overrides: list[str] | None) -> Config:
    with user_errors():
        return load_config(config, overrides or [])


@app.command("check-config")
def check_config(config: ConfigArg, set_: SetOpt = None) -> None:
    """Validate a config and print it resolved, with every default filled in.

    Example: nmt check-config configs/multi30k_en_fr.yaml --set model.attention=dot
    """
    cfg = _load(config, set_)
    sys.stdout.write(cfg.to_yaml())


@app.command()
def prepare(config: ConfigArg, set_: SetOpt = None) -> None:
    """Train (or reuse) the tokenizer and cache the tokenized data; report what was kept.

    Example: NMT_DATA_DIR=../shared/data nmt prepare configs/multi30k_en_fr.yaml
    """
    cfg = _load(config, set_)
    with user_errors():
        from nmt.data import prepare as prepare_data

        prepared = prepare_data(cfg, log=typer.echo)
        for line in prepared.report_lines():
            typer.echo(line)


@app.command()
def train(
    config: ConfigArg,
    set_: SetOpt = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the run in run.dir from its last.pt.")
    ] = False,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="Delete the previous run's files in run.dir (nothing else), start over.",
        ),
    ] = False,
) -> None:
    """Train a model: tokenizer, batches, training, validation BLEU, checkpoints in run.dir.

    Example: nmt train configs/tiny.yaml --set model.attention=dot --set train.max_steps=200
    Ctrl-C or SIGTERM finishes the update under way, saves, and exits 130/143; `--resume`
    continues exactly where it stopped.
    Several GPUs or machines: torchrun --nproc_per_node 2 -m nmt train CONFIG
    """
    if resume and overwrite:
        _fail("--resume and --overwrite exclude each other")
    cfg = _load(config, set_)
    with user_errors():
        from nmt.train import fit

        result = fit(
            cfg, resume=resume, overwrite=overwrite, log=typer.echo, config_path=str(config)
        )
    if result.signal is not None:
        raise typer.Exit(128 + result.signal)


# --------------------------------------------------------------------------- translate, eval

ModelOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--model",
        "-m",
        help="Run directory or checkpoint file. Default: the latest trained run (runs/latest). "
        "Repeat for an ensemble (log-probabilities averaged per step; one tokenizer).",
        metavar="RUN_DIR_OR_CHECKPOINT",
    ),
]
BeamOpt = Annotated[
    int | None,
    typer.Option("--beam", "-b", help="Beam size, 1 = greedy. Default: the run's decode.beam."),
]
BatchSizeOpt = Annotated[
    int | None,
    typer.Option("--batch-size", help="Sentences decoded at once. Default: decode.batch_size."),
]
DeviceOpt = Annotated[
    str,
    typer.Option("--device", help="auto (a GPU where there is one, else cpu), cpu, cuda, cuda:N."),
]
PrecisionOpt = Annotated[
    str,
    typer.Option(
        "--precision",
        help="fp32; bf16 (CPUs with bf16 units and recent GPUs; scores differ slightly); "
        "fp16 (GPU); auto (bf16 or fp16 on a GPU, bf16 on CPUs with bf16 units, else fp32).",
    ),
]
ProgressOpt = Annotated[
    bool | None,
    typer.Option(
        "--progress/--no-progress",
        help="Progress bar on stderr. Default: when stderr is a terminal.",
        show_default=False,
    ),
]


def _warn(message: str) -> None:
    typer.echo(f"warning: {message}", err=True)


def _show_progress(progress: bool | None) -> bool:
    return sys.stderr.isatty() if progress is None else progress


@app.command()
def translate(
    sentences: Annotated[
        list[str] | None,
        typer.Argument(
            help="Sentences to translate. With none, stdin is read, one sentence a line.",
            show_default=False,
        ),
    ] = None,
    model: ModelOpt = None,
    input_: Annotated[
        Path | None, typer.Option("--input", "-i", help="Read sentences from FILE, one a line.")
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write translations to FILE.")
    ] = None,
    beam: BeamOpt = None,
    nbest: Annotated[
        int,
        typer.Option(
            "--nbest",
            help="Print the N best translations of each input, one a line: "
            "`INPUT_NUMBER ||| TEXT ||| SCORE` (numbered from 0, best first).",
        ),
    ] = 1,
    batch_size: BatchSizeOpt = None,
    device: DeviceOpt = "auto",
    precision: PrecisionOpt = "fp32",
    show_attention: Annotated[
        bool,
        typer.Option(
            "--show-attention",
            help="Print each attention matrix: source pieces across, target pieces down, "
            "weights in percent.",
        ),
    ] = False,
    attention_plot: Annotated[
        Path | None,
        typer.Option(
            "--attention-plot",
            help="Write the attention heatmap to FILE.png (several inputs: FILE-1.png, "
            "FILE-2.png, ... by input line).",
            metavar="FILE.png",
        ),
    ] = None,
    progress: ProgressOpt = None,
    interactive: Annotated[
        bool,
        typer.Option(
            "--interactive",
            help="Load the model once, then translate each line of stdin as it comes, with "
            "the time it took; Ctrl-D leaves. The default when stdin is a terminal and no "
            "sentence or --input is given.",
        ),
    ] = False,
) -> None:
    """Translate sentences given as arguments, from stdin, or from a file.

    Example: nmt translate "Two dogs play in the snow." --beam 5 --show-attention
    Empty lines give empty lines; inputs longer than the model's data.max_len are cut, with
    a warning.
    """

    with user_errors():
        from nmt.display import plot_paths
        from nmt.files import check_writable, read_lines, write_lines
        from nmt.translate import Translator

        if sentences and input_ is not None:
            raise NmtError("give sentences as arguments or --input FILE, not both")
        if interactive and (sentences or input_ is not None or output is not None):
            raise NmtError(
                "--interactive reads stdin and prints: not with sentences, --input or --output"
            )
        if interactive or (not sentences and input_ is None and sys.stdin.isatty()):
            _interactive(
                Translator.from_checkpoint(model or None, device, precision=precision, log=_warn),
                beam=beam,
                nbest=nbest,
                show_attention=show_attention,
                attention_plot=attention_plot,
            )
            return
        if attention_plot is not None and attention_plot.suffix.lower() != ".png":
            raise NmtError(f"--attention-plot {attention_plot}: expected a file name ending .png")
        # Before any decoding: a bad output path should not cost a whole translation run.
        if output is not None:
            check_writable(output, "--output")
        if attention_plot is not None:
            check_writable(attention_plot, "--attention-plot")
        lines = list(sentences) if sentences else read_lines(input_)
        translator = Translator.from_checkpoint(
            model or None, device, precision=precision, log=_warn
        )
        out = translator.translate(
            lines,
            beam=beam,
            nbest=nbest,
            batch_size=batch_size,
            progress=_show_progress(progress),
        )
        blocks = [_lines_of(t, i, nbest) for i, t in enumerate(out)]
        if output is not None:
            write_lines(output, [line for block in blocks for line in block])
        plots = plot_paths(attention_plot, len(out)) if attention_plot else [None] * len(out)
        for t, block, plot in zip(out, blocks, plots, strict=True):
            _show(t, block if output is None else [], show_attention=show_attention, plot=plot)


def _lines_of(t: Translation, i: int, nbest: int) -> list[str]:
    """What is printed for input number i: its translation, or its n best with scores."""
    if nbest > 1:
        return [f"{i} ||| {text} ||| {score:.4f}" for text, score in t.nbest]
    return [t.text]


def _show(t: Translation, lines: list[str], *, show_attention: bool, plot: Path | None) -> None:
    """Print a translation's lines, its attention matrix if asked, and draw its heatmap to
    `plot` (an empty input has no attention to draw)."""
    from nmt.display import format_attention, plot_attention

    for line in lines:
        typer.echo(line)
    if show_attention:
        typer.echo(format_attention(t) + "\n")
    if plot is not None and t.src_tokens:
        plot_attention(t, plot)
        typer.echo(f"attention plot: {plot}", err=True)


def _interactive(
    translator: Translator,
    *,
    beam: int | None,
    nbest: int,
    show_attention: bool,
    attention_plot: Path | None,
) -> None:
    """Translate stdin line by line as it comes (the model loaded once), each translation
    printed and flushed at once with its time on stderr; end of input (Ctrl-D) leaves."""
    import time

    from nmt.display import numbered_path

    if sys.stdin.isatty():
        typer.echo("type a sentence and press Enter; Ctrl-D leaves", err=True)
    for i, line in enumerate(iter(sys.stdin.readline, "")):
        start = time.perf_counter()
        (t,) = translator.translate([line.rstrip("\r\n")], beam=beam, nbest=nbest, progress=False)
        seconds = time.perf_counter() - start
        plot = numbered_path(attention_plot, i + 1) if attention_plot is not None else None
        _show(t, _lines_of(t, i, nbest), show_attention=show_attention, plot=plot)
        sys.stdout.flush()  # the answer first, then its time on stderr
        typer.echo(f"({seconds:.2f} s)", err=True)


@app.command()
def average(
    checkpoints: Annotated[
        list[Path],
        typer.Argument(
            help="A run directory (with --last N), or the checkpoint files to average.",
            show_default=False,
        ),
    ],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="The averaged checkpoint to write (.pt).")
    ],
    last: Annotated[
        int | None,
        typer.Option("--last", help="Average the run directory's last N step checkpoints."),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace OUTPUT if it exists.")
    ] = False,
) -> None:
    """Average the weights of checkpoints of one run into a checkpoint that translate and
    eval load like any other.

    Example: nmt average runs/multi30k_en_fr --last 3 -o runs/multi30k_en_fr/averaged.pt
    A run directory holding averaged.pt translates with it first.
    """
    with user_errors():
        from nmt.average import last_checkpoints, write_average
        from nmt.files import check_writable

        if last is not None:
            if len(checkpoints) != 1 or not checkpoints[0].is_dir():
                raise NmtError("--last N goes with one run directory: nmt average RUN_DIR --last N")
            paths = last_checkpoints(checkpoints[0], last)
        else:
            dirs = [p for p in checkpoints if p.is_dir()]
            if dirs:
                raise NmtError(f"{dirs[0]}: a run directory; add --last N, or name checkpoints")
            paths = list(checkpoints)
        if output.suffix != ".pt":
            raise NmtError(f"--output {output}: expected a file name ending .pt")
        if output.exists() and not overwrite:
            raise NmtError(f"--output {output}: exists; add --overwrite to replace it")
        if output.resolve() in {p.resolve() for p in paths}:
            raise NmtError(f"--output {output}: is one of the checkpoints being averaged")
        check_writable(output, "--output")
        write_average(paths, output)
        typer.echo(f"{output}: the mean of {len(paths)} checkpoints ({', '.join(map(str, paths))})")


@app.command("eval")
def eval_(
    model: ModelOpt = None,
    src: Annotated[
        Path | None,
        typer.Option("--src", help="Source file to translate instead of the config's test sets."),
    ] = None,
    ref: Annotated[
        Path | None, typer.Option("--ref", help="Reference translations of --src, one a line.")
    ] = None,
    tests_of: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="Score on this config's test sets instead of the run's own, e.g. to compare "
            "two models on the same sets.",
        ),
    ] = None,
    bleu: Annotated[
        bool, typer.Option("--bleu", help="Score BLEU (the default when no metric is named).")
    ] = False,
    chrf: Annotated[bool, typer.Option("--chrf", help="Score chrF.")] = False,
    beam: BeamOpt = None,
    batch_size: BatchSizeOpt = None,
    device: DeviceOpt = "auto",
    precision: PrecisionOpt = "fp32",
    lowercase: Annotated[
        bool, typer.Option("--lowercase", help="Case-insensitive scores (sacrebleu -lc).")
    ] = False,
    protocol: Annotated[
        str,
        typer.Option(
            "--protocol",
            help="sacrebleu: detokenized text, sacrebleu's tokenizer. wmt-mmt: the Multi30k "
            "shared-task protocol (lowercased, punctuation-normalised, Moses-tokenized), "
            "comparable with the papers.",
        ),
    ] = "sacrebleu",
    json_: Annotated[
        bool, typer.Option("--json", help="Print one JSON object per test set.")
    ] = False,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Write the hypotheses to FILE. Default: RUN_DIR/eval/SPLIT.beamK.hyp.",
        ),
    ] = None,
    progress: ProgressOpt = None,
) -> None:
    """Translate a test set and score it with sacrebleu, signature included.

    Example: nmt eval --bleu --chrf --beam 5 --protocol wmt-mmt
    Without --src/--ref, the run's config's test split(s) are used. The BLEU printed equals
    `sacrebleu REF -i HYP` on the references and the hypothesis file written.
    """

    with user_errors():
        import json

        from nmt.evaluate import PROTOCOLS, evaluate_split, test_sets
        from nmt.files import check_writable, read_lines
        from nmt.translate import Translator

        if protocol not in PROTOCOLS:
            raise NmtError(f"--protocol {protocol!r}: expected one of {', '.join(PROTOCOLS)}")
        if (src is None) != (ref is None):
            raise NmtError("--src and --ref go together: a source file and its references")
        if src is not None and tests_of is not None:
            raise NmtError("--config and --src/--ref: name one source of test sets, not both")
        other = load_config(tests_of) if tests_of is not None else None
        if output is not None:
            check_writable(output, "--output")
        metrics = [m for m, on in (("bleu", bleu), ("chrf", chrf)) if on] or ["bleu"]
        given: list[tuple[str, list[str], list[str]]] = []
        if src is not None and ref is not None:  # read and checked before the model loads
            name = src.name.split(".")[0] or src.name  # test_2016_flickr.en -> test_2016_flickr
            given = [(name, read_lines(src), read_lines(ref))]
            if len(given[0][1]) != len(given[0][2]):
                raise NmtError(
                    f"--src {src} has {len(given[0][1])} lines but --ref {ref} has "
                    f"{len(given[0][2])}: they must be aligned line by line"
                )
        translator = Translator.from_checkpoint(
            model or None, device, precision=precision, log=_warn
        )
        pair = (translator.config.data.src_lang, translator.config.data.tgt_lang)
        if other is not None and (other.data.src_lang, other.data.tgt_lang) != pair:
            raise NmtError(
                f"--config {tests_of}: its test sets are {other.data.src_lang}->"
                f"{other.data.tgt_lang}, but the model translates {pair[0]}->{pair[1]}"
            )
        if given:
            sets = given
        else:
            cache = translator.run_dir / "data" / "hf" if translator.run_dir else None
            sets = test_sets(other or translator.config, cache)
        if output is not None and len(sets) > 1:
            names = ", ".join(s[0] for s in sets)
            raise NmtError(f"--output: the config has {len(sets)} test sets ({names}), one file")
        for name, sources, refs in sets:
            report = evaluate_split(
                translator,
                split=name,
                sources=sources,
                references=refs,
                hyp_path=output,
                metrics=metrics,
                beam=beam,
                batch_size=batch_size,
                lowercase=lowercase,
                protocol=protocol,
                progress=_show_progress(progress),
            )
            if json_:
                typer.echo(json.dumps(report.to_json(), ensure_ascii=False))
                continue
            for score in report.scores.values():
                typer.echo(score.line)
            rate = report.n / report.seconds if report.seconds > 0 else float("inf")
            typer.echo(
                f"{name}: {report.n} sentences, beam {report.beam}, {report.seconds:.1f} s "
                f"({rate:.1f} sentences/s); hypotheses in {report.hypotheses}",
                err=True,
            )


# --------------------------------------------------------------------------- serve


@app.command()
def serve(
    model: ModelOpt = None,
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on; 0.0.0.0 opens it to the network.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port; 0 picks a free one.")] = 8080,
    device: DeviceOpt = "auto",
    precision: PrecisionOpt = "fp32",
    max_batch: Annotated[
        int,
        typer.Option(
            "--max-batch",
            help="Sentences of concurrent requests decoded together (1: one request at a time).",
        ),
    ] = Limits.batch_sentences,
    batch_wait_ms: Annotated[
        float, typer.Option("--batch-wait-ms", help="How long a request waits for others.")
    ] = Limits.batch_wait_ms,
    max_sentences: Annotated[
        int, typer.Option("--max-sentences", help="Sentences in one request.")
    ] = Limits.max_sentences,
    max_chars: Annotated[
        int, typer.Option("--max-chars", help="Characters in one sentence.")
    ] = Limits.max_chars,
    max_beam: Annotated[
        int, typer.Option("--max-beam", help="Largest beam a request may ask for.")
    ] = Limits.max_beam,
    log_level: Annotated[
        str,
        typer.Option("--log-level", help="uvicorn's: debug, info (a line a request), warning."),
    ] = "info",
) -> None:
    """Serve a model over HTTP: POST /translate, GET /health, /info, /docs, and a page at /.

    Example: nmt serve --model runs/latest, then
    curl -s localhost:8080/translate -d '{"text": "A dog runs."}'
    Concurrent requests are decoded together; each gets what it would have got alone.
    SIGTERM or Ctrl-C answers the requests under way, then exits.
    """

    with user_errors():
        from nmt.serve import ServeOptions
        from nmt.serve import serve as run_server
        from nmt.translate import Translator

        for flag, value, least in (
            ("--max-batch", max_batch, 1),
            ("--batch-wait-ms", batch_wait_ms, 0),
            ("--max-sentences", max_sentences, 1),
            ("--max-chars", max_chars, 1),
            ("--max-beam", max_beam, 1),
        ):
            if value < least:
                raise NmtError(f"{flag} {value}: expected at least {least}")
        if not 0 <= port <= 65535:
            raise NmtError(f"--port {port}: expected 0 to 65535")
        limits = Limits(
            batch_sentences=max_batch,
            batch_wait_ms=batch_wait_ms,
            max_sentences=max_sentences,
            max_chars=max_chars,
            max_beam=max_beam,
        )
        translator = Translator.from_checkpoint(
            model or None, device, precision=precision, log=_warn
        )
        run_server(
            translator, ServeOptions(host=host, port=port, limits=limits, log_level=log_level)
        )
