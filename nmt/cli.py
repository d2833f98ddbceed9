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
