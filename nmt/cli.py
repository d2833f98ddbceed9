"""The `nmt` command line: each command parses its options and calls one library function.

Heavy libraries (torch, datasets) are imported inside the commands that need them, so
`nmt --help` and `nmt check-config` answer at once. Mistakes a user can fix (`NmtError`)
become one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, TypeVar

import typer

from nmt.config import Config, ConfigError, load_config
from nmt.errors import NmtError

app = typer.Typer(
    name="nmt",
    help="Neural machine translation: one YAML file gives a tokenizer, a trained model, "
    "translations and a BLEU score.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

T = TypeVar("T")

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


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _guard(fn: Callable[[], T]) -> T:
    """Run `fn`, turning user-fixable errors into one line each and exit code 2."""
    try:
        return fn()
    except ConfigError as e:
        for problem in e.problems:
            typer.echo(f"error: {e.source}: {problem}", err=True)
        raise typer.Exit(2) from None
    except NmtError as e:
        _fail(str(e))
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        raise typer.Exit(130) from None
    raise AssertionError("unreachable")


def _load(config: Path, overrides: list[str] | None) -> Config:
    return _guard(lambda: load_config(config, overrides or []))


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

    Example: NMT_DATA_DIR=../shared/data/multi30k nmt prepare configs/multi30k_en_fr.yaml
    """
    cfg = _load(config, set_)

    def run() -> None:
        from nmt.data import prepare as prepare_data

        prepared = prepare_data(cfg, log=typer.echo)
        for line in prepared.report_lines():
            typer.echo(line)

    _guard(run)


@app.command()
def train(
    config: ConfigArg,
    set_: SetOpt = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the run in run.dir from its last.pt.")
    ] = False,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Delete an existing run in run.dir and start over.")
    ] = False,
) -> None:
    """Train a model: tokenizer, batches, training, validation BLEU, checkpoints in run.dir.

    Example: nmt train configs/tiny.yaml --set model.attention=dot --set train.max_steps=200
    Ctrl-C saves a checkpoint; `--resume` continues exactly where it stopped.
    Several GPUs or machines: torchrun --nproc_per_node 2 -m nmt train CONFIG
    """
    if resume and overwrite:
        _fail("--resume and --overwrite exclude each other")
    cfg = _load(config, set_)

    def run() -> None:
        from nmt.train import fit

        fit(cfg, resume=resume, overwrite=overwrite, log=typer.echo, config_path=str(config))

    _guard(run)
