"""What the tests that start a program of their own share: `python -c` run alone, so that a
hang fails the test instead of holding the suite; a script's refusal of its arguments; and a
program that gets Ctrl-C while code of the repository starts a process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

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


def refusal(script: Path, *args: str) -> str:
    """The one line `script` (run from the repository's root) says as it refuses `args`:
    argparse's exit 2, no traceback."""
    proc = subprocess.run(
        [sys.executable, str(script), *args],
        cwd=script.parents[1],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr.strip().splitlines()[-1]


# A program that runs `code` (argv[2], with argv[1] on its path), which starts a process
# through `subprocess.Popen`, and gets Ctrl-C (SIGINT) there: while the process starts (argv[3]
# "while it starts": Popen made to take it before it returns) or wherever `code` calls
# `interrupt()`. It keeps the KeyboardInterrupt, so that nothing is garbage-collected, and
# prints whether the process it started is still there (then kills it).
INTERRUPTED_START = """
import os, signal, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
started = []
def interrupt(*_):
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.5)  # Python's handler has run by now
class Starting(subprocess.Popen):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        started.append(self.pid)
        if sys.argv[3] == "while it starts":
            interrupt()
subprocess.Popen = Starting
# `code` as a function's body: a KeyboardInterrupt out of exec() itself would make Python end
# by SIGINT at exit, caught or not
scope = {"interrupt": interrupt}
exec("def main():\\n" + "".join(f"    {line}\\n" for line in sys.argv[2].splitlines()), scope)
try:
    scope["main"]()
except KeyboardInterrupt as e:
    kept = e
    try:
        os.kill(started[0], 0)
    except ProcessLookupError:
        print("ended")
    else:
        print("left running")
        os.kill(started[0], signal.SIGKILL)
"""


def interrupted_start(path: str, code: str, when: str) -> str:
    """What INTERRUPTED_START prints for `code` run with `path` on its path: "ended" where the
    process `code` started was ended with the interrupt."""
    ran = run_alone([INTERRUPTED_START, path, code, when], hung="the interrupted start hung")
    assert ran.returncode == 0 and ran.stderr == "", ran.stderr
    return ran.stdout
