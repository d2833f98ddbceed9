"""The `nmt` command line: each command parses its options and calls one library function.

Heavy libraries (torch, datasets) are imported inside the commands that need them, so
`nmt --help` and `nmt check-config` answer at once. The training commands are here, the
decoding ones (translate, eval) in `nmt.cli_decode`, serve in `nmt.cli_serve`, what they share in
`nmt.cli_shared`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from nmt import cli_decode, cli_serve
from nmt.cli_shared import (
    ConfigArg,
    SetOpt,
    fail,
    help_text,
    load,
    show_tracebacks,
    user_errors,
)
from nmt.errors import NmtError

app = typer.Typer(
    name="nmt",
    help="Neural machine translation: one YAML file gives a tokenizer, a trained model, "
    "translations and a BLEU score.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


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
    show_tracebacks(debug)


@app.command("check-config")
def check_config(config: ConfigArg, set_: SetOpt = None) -> None:
    """Validate a config and print it resolved, with every default filled in.

    Example:
        nmt check-config configs/multi30k_en_fr.yaml --set model.attention=dot
    """
    cfg = load(config, set_)
    sys.stdout.write(cfg.to_yaml())


@app.command()
def prepare(config: ConfigArg, set_: SetOpt = None) -> None:
    """Train (or reuse) the tokenizer and cache the tokenized data; report what was kept.

    Example:
        NMT_DATA_DIR=../shared/data nmt prepare configs/multi30k_en_fr.yaml
    """
    cfg = load(config, set_)
    with user_errors():
        from nmt.data import prepare as prepare_data
        from nmt.run_dir import RunFiles

        RunFiles(cfg.run_dir, cfg.train.keep_last).adopt()  # so that `nmt train` takes it on
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

    Ctrl-C or SIGTERM finishes the update under way, saves, and exits 130/143; `--resume`
    continues exactly where it stopped. Several GPUs or machines: `torchrun`, as below.

    Example:
        nmt train configs/tiny.yaml --set model.attention=dot
        nmt train configs/tiny.yaml --set model.attention=dot --resume
        torchrun --nproc_per_node 2 -m nmt train CONFIG
    """
    if resume and overwrite:
        fail("--resume and --overwrite exclude each other")
    cfg = load(config, set_)
    with user_errors():
        from nmt.train import fit

        result = fit(
            cfg, resume=resume, overwrite=overwrite, log=typer.echo, config_path=str(config)
        )
    if result.signal is not None:
        raise typer.Exit(128 + result.signal)


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

    A run directory holding averaged.pt translates with it first.

    Example:
        nmt average runs/latest --last 3 -o runs/latest/averaged.pt
    """
    with user_errors():
        from nmt.average import last_checkpoints, write_average
        from nmt.files import check_output
        from nmt.run_dir import is_run_checkpoint_name

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
        if is_run_checkpoint_name(output):
            raise NmtError(
                f"--output {output}: a run's own checkpoint (training writes and resumes from "
                "it); write the average under another name, e.g. averaged.pt"
            )
        if output.exists() and not overwrite:
            raise NmtError(f"--output {output}: exists; add --overwrite to replace it")
        check_output(output, "--output", [(p, "checkpoint") for p in paths])
        write_average(paths, output)
        typer.echo(f"{output}: the mean of {len(paths)} checkpoints ({', '.join(map(str, paths))})")


# The decoding commands, in the order `nmt --help` lists them.
app.command()(cli_decode.translate)
app.command("eval")(cli_decode.eval_)
app.command()(cli_serve.serve)

for _command in app.registered_commands:  # each --help wrapped at the terminal's width
    _command.help = help_text(_command.callback.__doc__ if _command.callback else None)
