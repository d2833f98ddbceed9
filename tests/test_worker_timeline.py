"""scripts/worker_timeline.py: a decoding's batches across its worker processes."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import ROOT, TinyRun

SCRIPT = ROOT / "scripts" / "worker_timeline.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


def test_every_batch_is_counted_once_across_the_workers(tiny_run: TinyRun, tmp_path):
    src = tmp_path / "src.txt"
    src.write_text("\n".join(tiny_run.train_src[:7]) + "\n", encoding="utf-8")
    done = _run(str(tiny_run.checkpoint), "--src", str(src), "--workers", "2", "--batch-size",
                "2", "--calls", "2", "--batches", "--warm", "alternate")  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.count("call ") == 2 and "first batch started at" in out
    assert "call 1:" in out and "call 2, workers warmed first" in out
    for call in out.split("call ")[1:]:
        counts = [int(n) for n in re.findall(r"worker \d: (\d+) batch(?:es)?,", call)]
        assert 1 <= len(counts) <= 2 and sum(counts) == 4  # 7 sentences, 2 a batch
        assert len(re.findall(r"^    \d+: [\d.]+-[\d.]+ s, [\d,]+ faults$", call, re.M)) == 4


def test_a_missing_source_file_is_one_line(tiny_run: TinyRun, tmp_path):
    done = _run(str(tiny_run.checkpoint), "--src", str(tmp_path / "none.en"))
    assert done.returncode != 0 and "none.en" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
