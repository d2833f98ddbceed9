"""Showing what a translation attended to: aligned text for a terminal, a heatmap PNG.

Both read a `Translation` (its source and target pieces and the (T, S) attention matrix);
`nmt translate --show-attention` / `--attention-plot` and the server's page use them.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nmt.errors import NmtError
from nmt.files import write_output

if TYPE_CHECKING:
    from nmt.translate import Translation


def format_attention(t: Translation) -> str:
    """The attention matrix as aligned text: source pieces across, target pieces down,
    weights in percent ("." below 5%, so that the alignment stands out). A copy model adds a
    last column, `copy`: the percent of each target piece's probability copied (1 − g)."""
    if not t.src_tokens:
        return "(empty input: no attention)"
    rows = t.tgt_labels
    label_w = max([len(r) for r in rows] + [1])
    widths = [max(len(s), 3) for s in t.src_tokens]
    header = " ".join(s.rjust(w) for s, w in zip(t.src_tokens, widths, strict=True))
    copied = t.copied if t.copied is not None else [None] * len(rows)
    lines = [" " * label_w + " " + header + (" | copy" if t.copied is not None else "")]
    for label, weights, c in zip(rows, t.attention.tolist(), copied, strict=True):
        cells = [
            (f"{round(100 * v)}" if v >= 0.05 else ".").rjust(w)
            for v, w in zip(weights, widths, strict=True)
        ]
        tail = "" if c is None else f" | {round(100 * c):>4}"
        lines.append(label.ljust(label_w) + " " + " ".join(cells) + tail)
    return "\n".join(lines)


def plot_paths(path: Path, n: int) -> list[Path]:
    """Where the heatmaps of `n` sentences go: `path` itself for one sentence, otherwise
    `stem-1.png`, `stem-2.png`, ... numbered by input line, next to it."""
    if n == 1:
        return [path]
    return [numbered_path(path, i) for i in range(1, n + 1)]


def check_plot_paths(path: Path, n: int) -> None:
    """Refuse to write the heatmaps of `n` sentences over files the user did not name: with
    several sentences they go to `stem-1.png`, `stem-2.png`, ..., and none may exist yet
    (`path` itself, named by the user, is `write_output`'s to replace, for one sentence)."""
    if n < 2:
        return
    taken = [p for p in plot_paths(path, n) if p.exists() or p.is_symlink()]
    if taken:
        more = f" and {len(taken) - 1} more" if len(taken) > 1 else ""
        raise NmtError(
            f"--attention-plot {path}: {n} sentences go to {path.stem}-1{path.suffix} ... "
            f"{path.stem}-{n}{path.suffix}, and {taken[0]}{more} exists; nothing was written: "
            "remove them or choose another name"
        )


def numbered_path(path: Path, i: int) -> Path:
    """`stem-i.png` beside `path`: the heatmap of input line i."""
    return path.with_name(f"{path.stem}-{i}{path.suffix or '.png'}")


def plot_attention(t: Translation, path: Path) -> None:
    """Write the attention heatmap as a PNG, read like Bahdanau et al. (2015), figure 3:
    source pieces across the top, target pieces down, white = all the weight, black = none."""
    from matplotlib.figure import Figure

    if not t.src_tokens:
        raise NmtError(f"{path}: no attention to plot for an empty input")
    rows, cols = t.tgt_labels, t.src_tokens
    cell = 0.35  # inches per token
    extra = 0 if t.copied is None else 2  # the copy column and a gap
    width = max(3.0, 1.5 + cell * (len(cols) + extra))
    fig = Figure(figsize=(width, max(2.5, 1.5 + cell * len(rows))))
    if t.copied is None:
        ax = fig.add_subplot()
    else:  # copy attention: one more column, orange, the share of each row copied (1 - g)
        ax, cx = fig.subplots(1, 2, sharey=True, width_ratios=[len(cols), 1])
        cx.imshow([[c] for c in t.copied], cmap="Oranges", vmin=0.0, vmax=1.0, aspect="equal")
        cx.set_xticks([0], ["copy"], rotation=90)
        cx.xaxis.tick_top()
        cx.tick_params(length=0)
    ax.imshow(t.attention.numpy(), cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
    ax.set_xticks(range(len(cols)), cols, rotation=90)
    ax.set_yticks(range(len(rows)), rows)
    ax.xaxis.tick_top()
    ax.tick_params(length=0)
    with warnings.catch_warnings():
        # Pieces in scripts the default font lacks are drawn as boxes; the plot still reads.
        warnings.filterwarnings("ignore", message="Glyph .* missing from font")
        save_figure(fig, path, dpi=100)


def save_figure(fig: Any, path: Path, *, dpi: int) -> None:
    """Write a matplotlib figure as a PNG (`nmt.files.write_output`: atomically, keeping what
    the user owns)."""
    write_output(path, lambda f: fig.savefig(f, format="png", dpi=dpi, bbox_inches="tight"))
