"""Exponential smoothing of the weights: a running average of the parameters, updated after
every optimizer update, that validation, the checkpoints and decoding use, while the
optimizer goes on with the trained ones (Marian's `--exponential-smoothing`, OpenNMT-py's
`average_decay`; Polyak and Juditsky 1992).

At a constant learning rate the weights keep moving around a good region, and a model read
at one update is one sample of that wandering: greedy output that repeats at one
checkpoint and not at the next (docs/benchmarks.md, sessions 54-55). The average is what
`nmt average` gives at the end of a run, kept all the way through.

The weight of update n's parameters is Marian's and OpenNMT-py's: max(factor, 9 / (n + 10)),
and the average starts as the weights after the first update. So early on it follows the
weights closely (9/20 at update 10, 9/110 at update 100) and only after 9 / factor updates
(90,000 for 1e-4) does the factor alone set it: about the last 1/w updates count.

`torch.optim.swa_utils.AveragedModel` computes the same kind of average, with a fixed decay.
It reads its update counter back from the device every update (`bool(self.n_averaged ==
0)`), a host-device sync on a GPU; here the count is the training step, a Python int, and
the update is the one `torch._foreach_lerp_` call that its EMA function makes.
"""

from __future__ import annotations

import copy

import torch

from nmt.model import Seq2Seq


def weight_of(step: int, factor: float) -> float:
    """The weight of the parameters after update `step` (1-based) in the average."""
    if step <= 1:
        return 1.0  # the average starts as the weights themselves
    return max(factor, 1.0 - (step + 1) / (step + 10))


class Smoothed:
    """The running average of `trained`'s parameters, held as a model of its own (so that it
    validates, decodes and saves like any other). Every rank keeps one under DDP: the
    replicas' weights are equal after each update, and so are their averages."""

    def __init__(self, trained: Seq2Seq, factor: float) -> None:
        self.factor = factor
        self.model = copy.deepcopy(trained).requires_grad_(False)
        # Views of the same storage: load_state_dict on either model copies into them.
        self._average = [p.detach() for p in self.model.parameters()]
        self._trained = [p.detach() for p in trained.parameters()]

    @torch.no_grad()
    def update(self, step: int) -> None:
        """Fold in the weights after update `step` (no host-device sync: one foreach op)."""
        torch._foreach_lerp_(self._average, self._trained, weight_of(step, self.factor))
