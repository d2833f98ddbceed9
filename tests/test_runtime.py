"""Device and precision choice (`nmt.runtime`)."""

from __future__ import annotations

import resource
import sys

import pytest
import torch

from nmt.errors import NmtError
from nmt.runtime import configure_device, keep_freed_memory, resolve_precision


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


def _faults_of_fresh_tensors(size: int) -> int:
    """Minor page faults taken to allocate, write and free 6 tensors of `size` floats one
    after another, after 6 more as warm-up (glibc's heap settles in a few: posix_memalign
    asks for a little more than the block just freed, so the first ones may take new
    memory)."""
    for _ in range(6):
        torch.empty(size).fill_(1.0)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(6):
        torch.empty(size).fill_(2.0)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc is Linux's")
def test_freed_memory_is_reused_not_faulted_in_again():
    # A 40 MB block (a 1,280 × 8,000 float32 tensor) is above glibc's mmap threshold: as it
    # comes, every allocation of one is 10,240 fresh pages for the kernel to fault in and
    # zero; kept, the freed block is reused.
    size = 10 * 1024 * 1024
    try:
        if not keep_freed_memory(False):
            pytest.skip("not glibc's malloc (musl?): nothing to switch")
        assert _faults_of_fresh_tensors(size) > 5 * 10_000
        configure_device(torch.device("cpu"))  # what training and translation start with
        # glibc may still place one of the six in new memory now and then (the heap's layout
        # settles); every one of them faulted in is what the switch removes
        assert _faults_of_fresh_tensors(size) < 2.5 * 10_240
    finally:
        keep_freed_memory(True)
