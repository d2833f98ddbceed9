"""What the tests that start a program of their own share: `python -c` run alone, so that a
hang fails the test instead of holding the suite."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest


def run_alone(args: list[str], *, hung: str) -> subprocess.CompletedProcess[str]:
    """`python -c args...` in a session of its own, killed with whatever it started and
    failing the test (`hung`) after 60 s. Its output as text."""
    proc = subprocess.Popen(
        [sys.executable, "-c", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(hung)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
