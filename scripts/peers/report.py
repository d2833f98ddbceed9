"""What scripts/compare_peers.py writes besides its table: the run's JSON (--out), and the
learning curves (--plot)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from nmt.display import save_figure
from nmt.files import write_output
from peers.common import Result
from peers.limit import Cpu, Limit
from peers.previous import PreviousRun


@dataclass
class Report:
    """The run's JSON (--out): what it measured, and the machine it ran on."""

    args: argparse.Namespace
    threads: int
    cpu: Cpu
    gpu: str | None
    limits: dict[str, Limit]
    # --redecode: the run decoded again, whose training figures the rows keep; the file then
    # says how that run trained (budget, seed, turns, overrides, decay, smoothing), not what this
    # command's flags were
    trained: PreviousRun | None = None

    def write(self, results: list[Result], *, decoded: bool) -> None:
        """`decoded`: whether the rows' decodings have run (their cells are empty before)."""
        args = self.args
        # what its rows trained with: the run decoded again's, else this command's flags
        # (a PreviousRun names them as the flags do)
        trained = self.trained or args
        run = {
            "threads": self.threads,
            "torch": torch.__version__,
            "cpu": self.cpu.name,
            "cpu_id": self.cpu.id,
            "cpu_flags": list(self.cpu.flags),
            "gpu": self.gpu,
            "limits": {p: asdict(lim) for p, lim in self.limits.items()},
            "minutes": trained.minutes,
            "updates": trained.updates,
            "int8_decoding": args.int8,
            "decode_workers": args.decode_workers,
            "decode_repeats": args.decode_repeats,
            "redecoded": bool(args.again),
            "decoded": decoded,
            "seed": trained.seed,
            "nmt_config": str(args.nmt_config),
            "nmt_set": list(trained.nmt_set),
            "decay": list(trained.decay) if trained.decay else None,
            "smoothing": trained.smoothing,
            "interleave": trained.interleave,
            "results": [asdict(r) for r in results],
        }
        write_output(args.out, json.dumps(run, indent=1).encode())


def plot(results: list[Result], path: Path, minutes: float) -> None:
    """Validation BLEU (greedy) against training minutes, every toolkit on the same axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for r in results:
        if r.curve:
            ax.plot(
                [p["minutes"] for p in r.curve],
                [p["val_bleu"] for p in r.curve],
                marker="o",
                label=r.name,
            )
    ax.set_xlabel("training minutes (this machine)")
    ax.set_ylabel("val BLEU, greedy (sacreBLEU)")
    ax.set_xlim(0, minutes * 1.05 if minutes else None)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)
