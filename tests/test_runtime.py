"""Device and precision choice (`nmt.runtime`)."""

from __future__ import annotations

import subprocess
import sys

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


# Run in a process of its own: what earlier tests allocated and freed in the suite's process
# (a heap that keeps 1 GiB free, its blocks in glibc's bins) serves the blocks measured here
# from memory already mapped, whatever the switch says, and the first count came out 1.
FAULTS_SCRIPT = """
import resource, torch
from nmt.runtime import configure_device, keep_freed_memory

def faults_of_fresh_tensors(size):
    # minor page faults taken to allocate, write and free 6 tensors of `size` floats one
    # after another, after 6 more as warm-up (glibc's heap settles in a few: posix_memalign
    # asks for a little more than the block just freed, so the first ones may take new memory)
    for _ in range(6):
        torch.empty(size).fill_(1.0)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(6):
        torch.empty(size).fill_(2.0)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

if keep_freed_memory(False):
    as_it_comes = faults_of_fresh_tensors(10 * 1024 * 1024)
    configure_device(torch.device("cpu"))  # what training and translation start with
    print(as_it_comes, faults_of_fresh_tensors(10 * 1024 * 1024))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc is Linux's")
def test_freed_memory_is_reused_not_faulted_in_again():
    # A 40 MB block (a 1,280 × 8,000 float32 tensor) is above glibc's mmap threshold: as it
    # comes, every allocation of one is 10,240 fresh pages for the kernel to fault in and
    # zero; kept, the freed block is reused.
    done = subprocess.run(
        [sys.executable, "-c", FAULTS_SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    if not done.stdout.strip():
        pytest.skip("not glibc's malloc (musl?): nothing to switch")
    as_it_comes, kept = map(int, done.stdout.split())
    assert as_it_comes > 5 * 10_000
    # glibc may still place one of the six in new memory now and then (the heap's layout
    # settles); every one of them faulted in is what the switch removes
    assert kept < 2.5 * 10_240
