"""Device and precision choice (`nmt.runtime`)."""

from __future__ import annotations

import pytest
import torch

from nmt.errors import NmtError
from nmt.runtime import resolve_precision


def test_precision_resolution():
    cpu = torch.device("cpu")
    assert resolve_precision("fp32", cpu) == "fp32"
    assert resolve_precision("bf16", cpu) == "bf16"
    assert resolve_precision("auto", cpu) in ("bf16", "fp32")
    with pytest.raises(NmtError, match="fp16 needs a GPU"):
        resolve_precision("fp16", cpu)


@pytest.mark.parametrize(
    ("capability", "expected"),
    [((7, 0), "fp16"), ((7, 5), "fp16"), ((8, 0), "bf16"), ((9, 0), "bf16")],
)
def test_auto_precision_picks_bf16_only_where_the_gpu_has_it_natively(
    monkeypatch, capability, expected
):
    # torch.cuda.is_bf16_supported() also counts emulation (V100, T4): not a reason for bf16.
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert resolve_precision("auto", torch.device("cuda", 0)) == expected
