"""nmt.dropout: the CPU mask from 16-bit draws keeps nn.Dropout's contract."""

from __future__ import annotations

import pytest
import torch

from nmt.dropout import Dropout, cheap_mask


@pytest.mark.parametrize("p", [0.1, 0.2, 0.5, 0.95])
def test_each_element_is_kept_with_probability_one_minus_p_and_scaled_to_keep_the_mean(p):
    torch.manual_seed(0)
    layer = Dropout(p).train()
    x = torch.ones(2_000_000)
    y = layer(x)
    kept = y != 0
    # 2M Bernoulli draws: a standard deviation of at most 0.00035 on the share kept
    assert abs(kept.float().mean().item() - (1 - p)) < 0.002
    assert torch.all(y[kept] == y[kept][0])  # one scale for every kept element
    assert y[kept][0].item() == pytest.approx(1 / (1 - p), rel=1e-4)
    assert y.mean().item() == pytest.approx(1.0, abs=0.02 if p > 0.9 else 0.005)


def test_the_masks_bits_are_independent_across_the_four_lanes_of_a_draw():
    """Four neighbours come from one 64-bit draw: each lane alone, and pairs of lanes
    together, must keep at the right rates (a lane with a fixed sign bit would not)."""
    torch.manual_seed(1)
    keep = round(0.8 * 65536)
    mask = cheap_mask(torch.Size([400_000, 4]), keep, torch.float32) > 0  # (N, 4) lanes
    for lane in range(4):
        assert abs(mask[:, lane].float().mean().item() - 0.8) < 0.004
    both = (mask[:, 0] & mask[:, 3]).float().mean().item()
    assert abs(both - 0.64) < 0.004


def test_the_gradient_is_the_same_mask_and_eval_mode_is_the_identity():
    torch.manual_seed(2)
    layer = Dropout(0.3)
    x = torch.randn(64, 7, 16, requires_grad=True)
    y = layer(x)
    y.sum().backward()
    assert x.grad is not None
    torch.testing.assert_close(x.grad * x.detach(), y.detach())  # d y / d x = the mask
    layer.eval()
    assert layer(x) is x
    assert Dropout(0.0).train()(x) is x


def test_the_same_seed_draws_the_same_mask_and_bf16_inputs_keep_their_dtype():
    x = torch.randn(3, 5, 8)
    torch.manual_seed(3)
    a = Dropout(0.2).train()(x)
    torch.manual_seed(3)
    b = Dropout(0.2).train()(x)
    assert torch.equal(a, b)
    assert Dropout(0.2).train()(x.bfloat16()).dtype == torch.bfloat16


def test_a_probability_outside_zero_to_one_is_refused():
    with pytest.raises(ValueError, match="dropout probability"):
        Dropout(1.0)


def test_a_mask_for_the_caller_keeps_the_layers_rate_and_is_none_where_nothing_drops():
    torch.manual_seed(4)
    layer = Dropout(0.25).train()
    like = torch.zeros(1, dtype=torch.bfloat16)
    mask = layer.mask((500, 400), like)
    assert mask is not None and mask.shape == (500, 400) and mask.dtype == torch.float32
    assert abs((mask > 0).float().mean().item() - 0.75) < 0.005
    zero, scale = mask.unique().tolist()
    assert zero == 0.0 and scale == pytest.approx(1 / 0.75, rel=1e-4)
    assert layer.eval().mask((3, 2), like) is None
    assert Dropout(0.0).train().mask((3, 2), like) is None
