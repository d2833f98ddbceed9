"""The hand-fused kernels that `scripts/bench_fused_scorer.py` measures (issue 25's lever, kept
out of nmt) give the loops' values: its check, run as the script runs it, compares the
decoder loop's outputs and every gradient, the encoder loop's, and decoding's scores with and
without the kernels, and fails where a kernel was never called (nmt's loops changed under
the lever). Compiling takes about half a minute; without a C++ compiler, ninja or Python's
C headers the test is skipped."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import NO_DATA, ROOT
from torch.utils.cpp_extension import is_ninja_available


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler (c++)")
@pytest.mark.skipif(not is_ninja_available(), reason="torch's C++ extensions build with ninja")
@pytest.mark.skipif(
    not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file(),
    reason="needs Python's C headers (Python.h)",
)
def test_the_fused_kernels_give_the_loops_values_and_are_all_called():
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_fused_scorer.py"),
         "--threads", "1", "--rows", "4", "--length", "3", "--hidden", "16"],
        capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "largest difference" in done.stdout and "one step's scorer at 4 × 3 × 16" in done.stdout


def test_data_it_cannot_read_is_refused_before_building_the_kernels():
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_fused_scorer.py"),
         "configs/reference_rnn.yaml", *NO_DATA, "--steps", "3"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: /nonexistent-nmt-data/multi30k/train.en: no such file")
    assert "largest difference" not in done.stdout  # refused before the kernels' check
