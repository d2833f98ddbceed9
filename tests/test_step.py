"""One update (`nmt.step`): accumulation, the grad scaler, skipped non-finite updates, and
the token loss."""

from __future__ import annotations

import math

import pytest
import torch
from train_setup import (
    step_once,
    tiny_model_and_batches,
)

from nmt.batching import collate
from nmt.config import config_from_dict
from nmt.model import Output
from nmt.optim import build_optimizer
from nmt.step import clipped_step, make_scaler, token_loss


def test_accumulation_gives_the_update_of_one_large_batch():
    cfg, model, rows, tgts = tiny_model_and_batches()
    big = collate(rows, tgts, [0, 1, 2, 3])
    halves = [collate(rows[:2], tgts[:2], [0, 1]), collate(rows[2:], tgts[2:], [2, 3])]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    loss_big, norm_big = step_once(model, cfg, [big])
    after_big = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    loss_acc, norm_acc = step_once(model, cfg, halves)
    torch.testing.assert_close(loss_acc, loss_big, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(norm_acc, norm_big, rtol=1e-5, atol=1e-6)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, after_big[k], rtol=1e-5, atol=1e-6)


def test_grad_scaler_is_unscaled_before_clipping_and_skips_inf_steps():
    cfg, model, rows, tgts = tiny_model_and_batches()
    batch = collate(rows, tgts, [0, 1, 2, 3])
    state = {k: v.clone() for k, v in model.state_dict().items()}
    _, plain_norm = step_once(model, cfg, [batch])
    model.load_state_dict(state)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    _, scaled_norm = step_once(model, cfg, [batch], scaler, precision="fp16")
    torch.testing.assert_close(scaled_norm, plain_norm, rtol=2e-2, atol=1e-4)

    # An inf in the gradients: the update is skipped and the scale halves.
    model.load_state_dict(state)
    hook = next(model.parameters()).register_hook(lambda g: g * math.inf)
    _, norm = step_once(model, cfg, [batch], scaler, precision="fp16")
    hook.remove()
    assert not torch.isfinite(norm)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert scaler.get_scale() == 2.0**11


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_non_finite_updates_are_skipped_in_every_precision(precision):
    cfg, model, rows, tgts = tiny_model_and_batches()
    batch = collate(rows, tgts, [0, 1, 2, 3])
    state = {k: v.clone() for k, v in model.state_dict().items()}
    scaler = make_scaler(torch.device("cpu"), precision)
    hook = next(model.parameters()).register_hook(lambda g: g * math.nan)
    _, norm = step_once(model, cfg, [batch], scaler, precision=precision)
    hook.remove()
    assert not torch.isfinite(norm)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert scaler.get_scale() == 1.0  # pinned: the next updates are not scaled
    _, norm = step_once(model, cfg, [batch], scaler, precision=precision)
    assert torch.isfinite(norm)
    assert not all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_token_loss_ignores_padding():
    logits = torch.randn(2, 3, 7)
    target = torch.tensor([[4, 5, 0], [6, 0, 0]])
    out = Output(logits=logits, attention=torch.zeros(2, 3, 4), src=torch.ones(2, 4).long())
    full = token_loss(out, target, 0.0)
    manual = sum(
        -torch.log_softmax(logits[b, t], -1)[target[b, t]] for b, t in [(0, 0), (0, 1), (1, 0)]
    )
    torch.testing.assert_close(full, manual)


@pytest.mark.parametrize("clip", [1e-3, 1e3, None])
def test_clipping_inside_the_fused_step_equals_clip_grad_norm_then_step(clip):
    """`clipped_step` hands the clip factor to the fused optimizer as its divisor: the same
    weights and norm as clip_grad_norm_ followed by a plain step (clipping on or off)."""
    _, model, rows, tgts = tiny_model_and_batches()
    batch = collate(rows, tgts, [0, 1, 2, 3])
    state = {k: v.clone() for k, v in model.state_dict().items()}
    results = []
    for ours in (False, True):
        model.load_state_dict(state)
        model.zero_grad(set_to_none=True)
        optimizer = build_optimizer(config_from_dict({}).train, model.parameters())
        token_loss(model(batch.src, batch.src_lens, batch.tgt_in), batch.tgt_out, 0.0).backward()
        if ours:
            norm = clipped_step(model, optimizer, clip)
        else:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip or math.inf)
            optimizer.step()
        results.append((norm, {k: v.clone() for k, v in model.state_dict().items()}))
    (ref_norm, ref), (norm, after) = results
    torch.testing.assert_close(norm, ref_norm)
    assert not all(torch.equal(v, state[k]) for k, v in after.items())  # it stepped
    for k, v in after.items():
        torch.testing.assert_close(v, ref[k], rtol=1e-6, atol=1e-7)
