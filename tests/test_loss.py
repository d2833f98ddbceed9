"""The loss terms (`nmt.loss`): `VocabTerms`' values and its one-pass gradient equal
autograd's through logsumexp, sum and gather; the plain loss ignores padding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nmt.loss import VocabTerms, cross_entropy
from nmt.tokenizer import PAD_ID


def _reference_terms(logits: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    x = logits.float()
    return torch.logsumexp(x, -1), x.sum(-1), x.gather(-1, ids)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vocab_terms_equal_autograds(dtype):
    torch.manual_seed(0)
    N, V, K = 37, 50, 4
    logits = (torch.randn(N, V) * 3).to(dtype).requires_grad_()
    ids = torch.randint(0, V, (N, K))
    ids[3] = ids[3, 0]  # an id read twice in a row: both terms reach its gradient
    ours = VocabTerms.apply(logits, ids)
    reference = _reference_terms(logits, ids)
    # arbitrary weights on each term, as copy_loss's mixture gives them
    weights = [torch.randn(N), torch.randn(N), torch.randn(N, K)]

    def weighted(terms: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return sum((w * x).sum() for w, x in zip(weights, terms, strict=True))

    (g_ours,) = torch.autograd.grad(weighted(ours), logits)
    (g_ref,) = torch.autograd.grad(weighted(reference), logits)
    for o, r in zip(ours, reference, strict=True):
        assert o.dtype == torch.float32
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-4)
    assert g_ours.dtype == dtype
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 0.02, "atol": 0.02}
    torch.testing.assert_close(g_ours, g_ref, **tol)


def test_vocab_terms_run_without_autograd():
    logits, ids = torch.randn(4, 9), torch.tensor([[1], [2], [3], [PAD_ID]])
    with torch.inference_mode():
        ours = VocabTerms.apply(logits, ids)
    for o, r in zip(ours, _reference_terms(logits, ids), strict=True):
        torch.testing.assert_close(o, r)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_plain_loss_is_float32_and_ignores_padding(dtype):
    torch.manual_seed(0)
    logits = torch.randn(6, 11).to(dtype).requires_grad_()
    target = torch.tensor([4, PAD_ID, 5, 6, PAD_ID, 7])
    loss = cross_entropy(logits, target, 0.1)
    assert loss.dtype == torch.float32
    (grad,) = torch.autograd.grad(loss, logits)
    assert grad[[1, 4]].abs().max() == 0  # padding rows count for nothing
    real = target != PAD_ID
    alone = cross_entropy(logits[real], target[real], 0.1)
    torch.testing.assert_close(loss, alone)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_plain_loss_equals_pytorchs_in_value_and_gradient(dtype, smoothing):
    torch.manual_seed(1)
    logits = (torch.randn(9, 13) * 4).to(dtype).requires_grad_()
    target = torch.tensor([4, PAD_ID, 5, 12, 6, PAD_ID, 7, 11, 3])
    loss = cross_entropy(logits, target, smoothing)
    (grad,) = torch.autograd.grad(loss, logits)
    wide = logits.detach().double().requires_grad_()
    want = F.cross_entropy(
        wide, target, ignore_index=PAD_ID, label_smoothing=smoothing, reduction="sum"
    )
    (want_grad,) = torch.autograd.grad(want, wide)
    torch.testing.assert_close(loss.double(), want, rtol=1e-5, atol=1e-5)
    tol = 1e-6 if dtype == torch.float32 else 8e-3  # the gradient is returned in bf16
    torch.testing.assert_close(grad.double(), want_grad, rtol=tol, atol=tol)
    assert grad.dtype == dtype
