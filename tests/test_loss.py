"""The fused cross entropy (`nmt.loss`) equals PyTorch's, values and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nmt.loss import cross_entropy
from nmt.tokenizer import PAD_ID


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_cross_entropy_equals_pytorchs(label_smoothing, dtype):
    torch.manual_seed(0)
    N, V = 37, 50
    logits = (torch.randn(N, V) * 3).to(dtype).requires_grad_()
    target = torch.randint(4, V, (N,))
    target[[0, 5, 36]] = PAD_ID  # padding rows count for nothing
    ours = cross_entropy(logits, target, label_smoothing)
    (g_ours,) = torch.autograd.grad(ours, logits)
    reference = F.cross_entropy(
        logits.float(), target, ignore_index=PAD_ID, label_smoothing=label_smoothing,
        reduction="sum",
    )  # fmt: skip
    (g_ref,) = torch.autograd.grad(reference, logits)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-4)
    assert g_ours.dtype == dtype
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 0.02, "atol": 2e-3}
    torch.testing.assert_close(g_ours, g_ref, **tol)
    assert g_ours[[0, 5, 36]].abs().max() == 0


def test_fused_cross_entropy_runs_without_autograd():
    logits, target = torch.randn(4, 9), torch.tensor([1, 2, 3, PAD_ID])
    with torch.inference_mode():
        value = cross_entropy(logits, target, 0.1)
    reference = F.cross_entropy(logits, target, ignore_index=PAD_ID, label_smoothing=0.1,
                                reduction="sum")  # fmt: skip
    torch.testing.assert_close(value, reference)
