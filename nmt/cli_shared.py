"""What the `nmt` commands share: option types, and turning a user's mistake into one line.

Mistakes a user can fix (`NmtError`) become one line on stderr and exit code 2, never a
traceback (with `--debug`, the traceback too).
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from nmt.config import Config, ConfigError, load_config
from nmt.errors import DecodeArgumentError, NmtError

if TYPE_CHECKING:
    from nmt.translate import Translator


def help_text(doc: str | None) -> str:
    """A command's docstring as its `--help` prints it: each paragraph one line, wrapped by
    the terminal at its own width, and an indented line (a command to type) a line of its own.

    Why: typer prints the paragraphs after the first with their line breaks as written, so a
    docstring wrapped at 100 columns came out cut mid-sentence at 80 (`--resume` alone on a
    line of `nmt train --help`)."""
    paragraphs = []
    for paragraph in inspect.cleandoc(doc or "").split("\n\n"):
        lines: list[str] = []
        for line in paragraph.splitlines():
            if lines and not line.startswith(" ") and not lines[-1].startswith(" "):
                lines[-1] += " " + line  # prose goes on
            else:
                lines.append(line)
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs)


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
FullVocabOpt = Annotated[
    bool,
    typer.Option(
        "--full-vocab",
        help="Decode over the whole target vocabulary, not the checkpoint's shortlist of the "
        "pieces these sentences can use (slower; the output rarely differs).",
    ),
]
Int8Opt = Annotated[
    bool,
    typer.Option(
        "--int8",
        help="CPU: decode with int8 weights in the RNNs, the Linear layers and the output "
        "layer (nmt.int8; faster, BLEU a little different).",
    ),
]
WorkersOpt = Annotated[
    int,
    typer.Option(
        "--workers",
        help="CPU: decode the batches in N processes of (threads / N) threads each, N at most "
        "the machine's cores; faster for files on small machines, greedy search above all "
        "(nmt.workers).",
        metavar="N",
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


def fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


_show_tracebacks = False


def show_tracebacks(on: bool) -> None:
    """`--debug`: errors print their traceback as well as their line."""
    global _show_tracebacks
    _show_tracebacks = on


def _lines_of(e: NmtError) -> list[str]:
    """How the command line says an error: a config's problems one a line, a decoding
    argument by its flag (`--nbest 4: ...`)."""
    if isinstance(e, ConfigError):
        return [f"{e.source}: {p}" for p in e.problems]
    if isinstance(e, DecodeArgumentError):
        return [f"--{e.argument.replace('_', '-')} {e.value}: expected {e.expected}"]
    return [str(e)]


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Mistakes a user can fix become one line each on stderr and exit code 2 (with
    `--debug`, the traceback too); Ctrl-C outside training exits 130."""
    try:
        yield
    except NmtError as e:
        if _show_tracebacks:
            traceback.print_exc()
        for line in _lines_of(e):
            typer.echo(f"error: {line}", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        raise typer.Exit(130) from None


def load(config: Path, overrides: list[str] | None) -> Config:
    with user_errors():
        return load_config(config, overrides or [])


def load_translator(
    model: list[str] | None,
    device: str,
    precision: str,
    *,
    full_vocab: bool = False,
    int8: bool = False,
    workers: int = 1,
) -> Translator:
    """The model(s) `--model` names (runs/latest without one; several: an ensemble), with
    warnings (long inputs cut) as `warning:` lines on stderr."""
    from nmt.translate import Translator

    return Translator.from_checkpoint(
        model or None,
        device,
        precision=precision,
        log=warn,
        shortlist=not full_vocab,
        int8=int8,
        workers=workers,
    )


def model_inputs(model: list[str] | None) -> list[tuple[Path, str]]:
    """The checkpoint files `--model` names (`runs/latest`'s without one): inputs that an
    output must not replace. A name that resolves to none is left to the loading to report."""
    from nmt.checkpoint import CheckpointError
    from nmt.run_dir import resolve_checkpoint

    found = []
    names: list[str | None] = list(model) if model else [None]
    for name in names:
        with contextlib.suppress(CheckpointError):
            found.append((resolve_checkpoint(name), "--model"))
    return found


def warn(message: str) -> None:
    typer.echo(f"warning: {message}", err=True)


def show_progress(progress: bool | None) -> bool:
    return sys.stderr.isatty() if progress is None else progress
