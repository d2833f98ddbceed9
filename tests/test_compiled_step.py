"""The compiled decoder steps that `scripts/bench_compiled_step.py` measures (issue 25's
`torch.compile` lever, kept out of nmt) give the loop's values: its check, run as the script
runs it, compares the decoder loop's outputs and every gradient with and without them, and
fails where they never ran (nmt's loop changed under the lever). Inductor compiles C++ for
the CPU: about 35 s here, skipped without a C++ compiler or Python's C headers."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import NO_DATA, ROOT


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler (c++)")
@pytest.mark.skipif(
    not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file(),
    reason="needs Python's C headers (Python.h)",
)
def test_the_compiled_steps_give_the_loops_values_and_run():
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_compiled_step.py"), "--check", "bf16"],
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "torch.bfloat16: compiled against the loop's operators: largest" in done.stdout


@pytest.mark.parametrize(
    "args, says",
    [
        (["configs/tiny.yaml", "--steps", "3"], "model.decoder: bahdanau"),
        (["configs/reference_rnn.yaml", "--checkpoint", "nope/step-1.pt"],
         "error: nope/step-1.pt: no such checkpoint"),
        (["configs/reference_rnn.yaml", *NO_DATA], "/nonexistent-nmt-data/multi30k/train.en"),
    ],
)  # fmt: skip
def test_a_model_it_is_not_written_for_a_missing_checkpoint_or_data_are_refused_first(args, says):
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_compiled_step.py"), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and says in last
    assert "compiled against" not in done.stdout  # refused before the check's compiling
