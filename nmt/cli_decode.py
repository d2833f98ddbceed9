"""The decoding commands of `nmt`: translate and eval (registered in `nmt.cli`; serve is in
`nmt.cli_serve`).

Each parses its options, loads a `Translator` and calls one library function; torch and the
rest are imported inside them, so `nmt --help` answers at once.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from nmt.cli_shared import (
    BatchSizeOpt,
    BeamOpt,
    DeviceOpt,
    FullVocabOpt,
    Int8Opt,
    ModelOpt,
    PrecisionOpt,
    ProgressOpt,
    WorkersOpt,
    load_translator,
    model_inputs,
    show_progress,
    user_errors,
    warn,
)
from nmt.config import load_config
from nmt.errors import NmtError
from nmt.files import MAX_LINE_BYTES, FileError, line_too_long

if TYPE_CHECKING:
    from nmt.translate import Translation, Translator


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
    full_vocab: FullVocabOpt = False,
    int8: Int8Opt = False,
    workers: WorkersOpt = 1,
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
    head: Annotated[
        int,
        typer.Option(
            "--head",
            help="With --show-attention / --attention-plot: show attention head K (1 .. the "
            "model's model.attention_heads) instead of the heads' mean.",
            metavar="K",
        ),
    ] = 0,
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

    Empty lines give empty lines; inputs longer than the model's data.max_len are cut, with
    a warning.

    Example:
        nmt translate "Two dogs play in the snow." --beam 5 --show-attention
    """

    with user_errors():
        from nmt.display import check_plot_paths, plot_paths
        from nmt.files import check_output, read_lines, write_lines

        if sentences and input_ is not None:
            raise NmtError("give sentences as arguments or --input FILE, not both")
        if interactive and (sentences or input_ is not None or output is not None):
            raise NmtError(
                "--interactive reads stdin and prints: not with sentences, --input or --output"
            )
        # Before any decoding: a bad output path should not cost a whole translation run, and
        # no output may replace an input (the model's checkpoint included).
        inputs = model_inputs(model) + ([(input_, "--input")] if input_ is not None else [])
        if attention_plot is not None:
            if attention_plot.suffix.lower() != ".png":
                raise NmtError(
                    f"--attention-plot {attention_plot}: expected a file name ending .png"
                )
            check_output(attention_plot, "--attention-plot", inputs)
        if output is not None:
            check_output(output, "--output", inputs)
            if attention_plot is not None and attention_plot.absolute() == output.absolute():
                raise NmtError(f"--attention-plot {attention_plot}: is also --output")
        if head < 0:
            raise NmtError(f"--head {head}: expected 1 to the model's heads (0: their mean)")
        if head and not (show_attention or attention_plot is not None):
            raise NmtError(f"--head {head}: shows with --show-attention or --attention-plot")
        if interactive or (not sentences and input_ is None and sys.stdin.isatty()):
            translator = load_translator(
                model, device, precision, full_vocab=full_vocab, int8=int8, workers=workers
            )
            _check_head(head, translator)
            _interactive(
                translator,
                beam=beam,
                nbest=nbest,
                show_attention=show_attention,
                attention_plot=attention_plot,
                head=head,
            )
            return
        lines = list(sentences) if sentences else read_lines(input_)
        if attention_plot is not None:
            check_plot_paths(attention_plot, len(lines))
        translator = load_translator(
            model, device, precision, full_vocab=full_vocab, int8=int8, workers=workers
        )
        _check_head(head, translator)
        out = translator.translate(
            lines,
            beam=beam,
            nbest=nbest,
            batch_size=batch_size,
            progress=show_progress(progress),
            with_heads=head > 0,
        )
        blocks = [_lines_of(t, i, nbest) for i, t in enumerate(out)]
        if output is not None:
            write_lines(output, [line for block in blocks for line in block])
        plots = plot_paths(attention_plot, len(out)) if attention_plot else [None] * len(out)
        for t, block, plot in zip(out, blocks, plots, strict=True):
            shown = block if output is None else []
            _show(t, shown, show_attention=show_attention, plot=plot, head=head)


def _check_head(head: int, translator: Translator) -> None:
    """--head K names one of the model's heads (0: their mean, always there)."""
    count = translator.heads
    if head == 0:
        return
    if count is None:
        raise NmtError(f"--head {head}: an ensemble's heads are no one model's; leave --head out")
    if head > count:
        raise NmtError(
            f"--head {head}: the model has {count} attention head(s) "
            f"(model.attention_heads); expected 1 to {count}"
        )


def _lines_of(t: Translation, i: int, nbest: int) -> list[str]:
    """What is printed for input number i: its translation, or its n best with scores."""
    if nbest > 1:
        return [f"{i} ||| {text} ||| {score:.4f}" for text, score in t.nbest]
    return [t.text]


def _show(
    t: Translation, lines: list[str], *, show_attention: bool, plot: Path | None, head: int = 0
) -> None:
    """Print a translation's lines, its attention matrix if asked, and draw its heatmap to
    `plot` (an empty input has no attention to draw); head K > 0: that head's weights."""
    import dataclasses

    from nmt.display import format_attention, plot_attention

    for line in lines:
        typer.echo(line)
    if head:
        t = dataclasses.replace(t, attention=t.attention_of(head))
    if show_attention:
        if head:
            typer.echo(f"attention head {head}:")
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
    head: int = 0,
) -> None:
    """Translate stdin line by line as it comes (the model loaded once), each translation
    printed and flushed at once with its time on stderr; end of input (Ctrl-D) leaves."""
    import time

    from nmt.display import numbered_path

    if sys.stdin.isatty():
        typer.echo("type a sentence and press Enter; Ctrl-D leaves", err=True)
    for i, line in enumerate(_stdin_lines()):
        start = time.perf_counter()
        (t,) = translator.translate(
            [line.rstrip("\r\n")], beam=beam, nbest=nbest, progress=False, with_heads=head > 0
        )
        seconds = time.perf_counter() - start
        plot = numbered_path(attention_plot, i + 1) if attention_plot is not None else None
        if plot is not None and plot.exists():  # a file nmt was not asked to replace
            warn(f"--attention-plot: {plot} exists; not replaced (no plot for line {i + 1})")
            plot = None
        _show(t, _lines_of(t, i, nbest), show_attention=show_attention, plot=plot, head=head)
        sys.stdout.flush()  # the answer first, then its time on stderr
        typer.echo(f"({seconds:.2f} s)", err=True)


def _stdin_lines() -> Iterator[str]:
    """stdin's lines as they come, decoded as UTF-8: a line that is not is one clear error."""
    stdin = getattr(sys.stdin, "buffer", None)
    if stdin is None:  # a text stream without bytes underneath (tests' fakes)
        yield from iter(sys.stdin.readline, "")
        return
    for i, raw in enumerate(iter(lambda: stdin.readline(MAX_LINE_BYTES + 1), b"")):
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):  # `cat /dev/zero |`
            raise line_too_long("stdin", i + 1)
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise FileError(f"stdin: line {i + 1} is not valid UTF-8 (byte {e.start})") from None


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
    full_vocab: FullVocabOpt = False,
    int8: Int8Opt = False,
    workers: WorkersOpt = 1,
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
            help="Write the hypotheses to FILE. Default: RUN_DIR/eval/SPLIT.beamK.hyp for a "
            "model in a run directory nmt made; none for a checkpoint elsewhere (its folder is "
            "yours).",
        ),
    ] = None,
    progress: ProgressOpt = None,
) -> None:
    """Translate a test set and score it with sacrebleu, signature included.

    Without --src/--ref, the run's config's test split(s) are used. The BLEU printed equals
    `sacrebleu REF -i HYP` on the references and the hypothesis file written.

    Example:
        nmt eval --bleu --chrf --beam 5 --protocol wmt-mmt
    """

    with user_errors():
        import json

        from nmt.evaluate import PROTOCOLS, choose_test_sets, evaluate_split, read_test_set
        from nmt.files import check_output

        if protocol not in PROTOCOLS:
            raise NmtError(f"--protocol {protocol!r}: expected one of {', '.join(PROTOCOLS)}")
        if (src is None) != (ref is None):
            raise NmtError("--src and --ref go together: a source file and its references")
        if src is not None and tests_of is not None:
            raise NmtError("--config and --src/--ref: name one source of test sets, not both")
        other = load_config(tests_of) if tests_of is not None else None
        if output is not None:
            given_files = [(p, o) for p, o in ((src, "--src"), (ref, "--ref")) if p is not None]
            check_output(output, "--output", model_inputs(model) + given_files)
        metrics = [m for m, on in (("bleu", bleu), ("chrf", chrf)) if on] or ["bleu"]
        given = read_test_set(src, ref) if src is not None and ref is not None else None
        translator = load_translator(
            model, device, precision, full_vocab=full_vocab, int8=int8, workers=workers
        )
        sets = choose_test_sets(
            translator.config, translator.run_dir, given=given, other=other, other_path=tests_of
        )
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
                progress=show_progress(progress),
            )
            if json_:
                typer.echo(json.dumps(report.to_json(), ensure_ascii=False))
                continue
            for score in report.scores.values():
                typer.echo(score.line)
            rate = report.n / report.seconds if report.seconds > 0 else float("inf")
            kept = (
                f"hypotheses in {report.hypotheses}"
                if report.hypotheses is not None
                else "hypotheses not kept (the model is not in a run directory; -o FILE keeps them)"
            )
            typer.echo(
                f"{name}: {report.n} sentences, beam {report.beam}, {report.seconds:.1f} s "
                f"({rate:.1f} sentences/s); {kept}",
                err=True,
            )
