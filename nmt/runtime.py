"""Where and how training runs: device, precision, autocast, seeding, torch.distributed."""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import functools
import gc
import os
import random
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist

from nmt.config import DEVICES, is_device_name
from nmt.errors import NmtError
from nmt.signals import STOP

Precision = Literal["fp32", "bf16", "fp16"]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(
    name: str,
    local_rank: int = 0,
    *,
    setting: str = "train.device",
    distributed: bool = False,
) -> torch.device:
    """`auto` = a GPU when there is one, else the CPU. `setting` names where the value came
    from (a config key or a flag) in errors.

    Under torchrun (`distributed`) each process takes the GPU of its LOCAL_RANK among those
    it sees; where it sees exactly one (Slurm's `srun` gives each task its own), that one,
    whatever its rank. An explicit `cuda:N` would put every process on GPU N: refused.
    """
    if not is_device_name(name):
        raise NmtError(f"{setting} {name!r}: expected {DEVICES}")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if not name.startswith("cuda"):
        return torch.device(name)
    if not torch.cuda.is_available():
        raise NmtError(f"{setting}: {name!r} asked for, but no CUDA GPU is available")
    count = torch.cuda.device_count()
    if name != "cuda":
        if distributed:
            raise NmtError(
                f"{setting}: {name!r} under torchrun would put every process on that GPU; "
                "use cuda or auto (each process takes the GPU of its LOCAL_RANK)"
            )
        index = int(name.split(":")[1])
        if index >= count:
            raise NmtError(f"{setting}: {name!r}, but only {count} GPU(s)")
        return torch.device(name)
    if not distributed or count == 1:
        return torch.device("cuda:0")
    if local_rank >= count:
        raise NmtError(
            f"{setting}: LOCAL_RANK {local_rank}, but this process sees only {count} GPUs "
            "(CUDA_VISIBLE_DEVICES); run at most one process per GPU"
        )
    return torch.device(f"cuda:{local_rank}")


@functools.cache
def cpuinfo(field: str) -> str:
    """A field of this machine's first CPU in /proc/cpuinfo ("vendor_id", "model name",
    "flags"), or "" where there is no such file (not Linux) or field."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() == field:
            return value.strip()
    return ""


@functools.cache
def cpu_has_bf16_matmul() -> bool:
    """True where oneDNN runs bf16 matrix products natively (AVX512-BF16 or AMX)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def cuda_has_native_bf16(device: torch.device) -> bool:
    """bf16 in hardware: compute capability 8.0 (Ampere) and later. `is_bf16_supported()`
    also counts emulation (V100, T4), where bf16 is slower than fp16."""
    return torch.cuda.get_device_capability(device) >= (8, 0)


def resolve_precision(
    precision: str, device: torch.device, *, setting: str = "train.precision"
) -> Precision:
    """`auto` = bf16 on GPUs that support it, fp16 on older GPUs, bf16 on CPUs with native
    bf16 matrix units, fp32 on other CPUs. fp16 on the CPU is refused: no GradScaler-worthy
    speed-up there, and bf16 is the CPU's half type. `setting` names the source in errors."""
    if precision not in ("auto", "fp32", "bf16", "fp16"):
        raise NmtError(f"{setting} {precision!r}: expected auto, fp32, bf16 or fp16")
    if precision == "auto":
        if device.type == "cuda":
            return "bf16" if cuda_has_native_bf16(device) else "fp16"
        return "bf16" if cpu_has_bf16_matmul() else "fp32"
    if precision == "fp16" and device.type == "cpu":
        raise NmtError(f"{setting}: fp16 needs a GPU; use bf16 or fp32 on the CPU")
    if precision == "bf16" and device.type == "cuda" and not cuda_has_native_bf16(device):
        major, minor = torch.cuda.get_device_capability(device)
        raise NmtError(
            f"{setting}: bf16 on this GPU (compute capability {major}.{minor}, below 8.0) is "
            "emulated, slower than fp16; use fp16, fp32 or auto"
        )
    return precision  # type: ignore[return-value]


def autocast(device: torch.device, precision: Precision) -> contextlib.AbstractContextManager:
    """Mixed-precision context for the forward pass and loss (a no-op in fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    cast = torch.autocast(device_type=device.type, dtype=DTYPES[precision])
    if device.type == "cpu" and not cpu_has_bf16_matmul():
        # Without AVX512-BF16/AMX, oneDNN has no bf16 LSTM kernel and fails ("could not
        # create a primitive descriptor"); ATen's own kernels run it instead.
        stack = contextlib.ExitStack()
        stack.enter_context(_without_onednn())
        stack.enter_context(cast)
        return stack
    return cast


def autocast_off(device_type: str) -> contextlib.AbstractContextManager:
    """Autocast off on `device_type`, for code that runs inside the update's autocast but
    keeps its own precision (casting its products itself, or float32 throughout): autocast
    would turn its float32 `bmm` and `@` into half-precision ones."""
    return torch.autocast(device_type, enabled=False)


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype autocast gives products on `device_type` ("cpu", "cuda") where it is on
    here, else None: for casting a tensor once that every step would otherwise cast."""
    if not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


@contextlib.contextmanager
def _without_onednn() -> Iterator[None]:
    # torch.backends.mkldnn.flags() would also reset TF32 flags, with a warning each time.
    before = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = before


def freeze_gc() -> None:
    """Put every object alive now (torch's modules and a loaded model: hundreds of thousands)
    out of the garbage collector's reach, for a process that loaded a model to decode with.

    Otherwise the first full collection walks them all: ~85 ms (2 cores, Python 3.11) in the
    middle of the first translations, or of a server's request. Frozen objects are never
    collected, which costs nothing for what stays alive while the model is used.
    """
    gc.freeze()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def rank_seed(seed: int, rank: int, step: int) -> int:
    """The seed of a DDP process other than rank 0 once its model is built: each rank its
    own dropout masks (with one stream, every replica drops the same units), and from the
    step, so that a resumed run (whose checkpoint holds rank 0's generator) draws alike."""
    return seed + 1_000_003 * rank + step


def configure_device(device: torch.device, threads: int | None = None) -> None:
    """Per-process settings, the same for training, validation, `nmt translate` and `nmt eval`
    (so that they compute alike): CPU threads; on GPUs, TF32 for fp32 matrix products and
    cuDNN RNNs. (cuDNN's `benchmark` autotuner is left off: it picks convolution
    algorithms, and this model has none.)"""
    if threads is not None:
        torch.set_num_threads(threads)
    if device.type == "cpu":
        keep_freed_memory()
    if device.type == "cuda":
        if device.index is not None:  # `cuda` alone is the current GPU: nothing to set
            torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


# glibc's mallopt parameters (malloc.h) and their values: kept, and glibc's defaults
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_KEPT = {_M_MMAP_MAX: 0, _M_TRIM_THRESHOLD: 1 << 30}  # up to 1 GiB of free heap kept
_DEFAULT = {_M_MMAP_MAX: 65536, _M_TRIM_THRESHOLD: 128 * 1024}


def keep_freed_memory(keep: bool = True) -> bool:
    """Let glibc's malloc reuse freed memory instead of returning it to the OS (False:
    glibc's defaults again); True where it took effect (Linux with glibc), False elsewhere,
    where nothing changes.

    Why: glibc serves every block above its mmap threshold (128 KiB, rising as blocks are
    freed, never above 32 MiB) with its own mmap and unmaps it when freed, so each (N, V)
    float32 tensor of a training step (1,280 × 8,000: 41 MB; the loss makes several)
    arrives as fresh pages that the kernel must fault in and zero. On 2 cores of an AMD
    EPYC the loss of a bf16 step took 3-5× longer that way (`scripts/bench_loss.py --dtype
    bf16`), and the reference model's bf16 step spent a sixth of its time in the kernel.
    PyTorch's CPU allocator is plain malloc, so this is the switch (jemalloc or tcmalloc
    preloaded would do the same). The price is peak memory: blocks of many sizes leave holes
    in the heap. 400 updates of the reference model: fp32 1.10× faster, peak RSS +1 %;
    bf16 1.23× faster, peak RSS 1.92 → 2.46 GB (+28 %)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "gnu_get_libc_version"):  # musl and others: their own malloc
        return False
    values = _KEPT if keep else _DEFAULT
    return all([bool(libc.mallopt(param, value)) for param, value in values.items()])


@dataclass(frozen=True)
class Distributed:
    """This process's place in a torchrun job (rank 0 of 1 when run alone)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()


def init_distributed(device_name: str, timeout_minutes: float) -> Distributed:
    """Join the process group that `torchrun` describes in the environment, if any:
    NCCL between GPUs, gloo between CPU processes.

    The collectives' timeout (`train.dist_timeout_minutes`) must cover the longest time one
    rank works alone while the others wait: rank 0 preparing the data (training the
    tokenizer, tokenizing, perhaps downloading) behind a barrier, and validating and saving
    behind a broadcast. NCCL's default of 10 minutes kills a job whose preparation is long.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Distributed()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    wants_gpu = device_name != "cpu" and torch.cuda.is_available()
    if not dist.is_initialized():
        dist.init_process_group(
            backend="nccl" if wants_gpu else "gloo",
            timeout=datetime.timedelta(minutes=timeout_minutes),
        )
    return Distributed(rank=rank, world=world, local_rank=local_rank)


def shutdown_distributed(ctx: Distributed) -> None:
    if ctx.enabled and dist.is_initialized():
        dist.destroy_process_group()


class StopSignals:
    """SIGINT (Ctrl-C) and SIGTERM (Slurm, Kubernetes, `timeout`) as a request to stop.

    Inside the `with` block a signal only sets `received`; the training loop reads it at
    the next step boundary, saves, and exits 128 + the signal number. Stopping in the middle
    of an update would save a state that no uninterrupted run passes through. A second
    signal raises KeyboardInterrupt at once (atomic writes keep the last checkpoint whole).
    Handlers can only be set in the main thread; elsewhere this does nothing. A signal this
    process was started with ignored stays ignored: a shell script's `nmt train ... &` gets
    SIGINT ignored so that the script's Ctrl-C leaves it running, as Python leaves an ignored
    SIGINT (and as `nmt.signals.held` does); SIGTERM still stops it.
    """

    SIGNALS = STOP

    def __init__(self, log: Callable[[str], None] = print) -> None:
        self.received: int | None = None
        self.log = log
        self._previous: dict[int, Any] = {}

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received is not None else ""

    def _handle(self, signum: int, frame: object) -> None:
        if self.received is not None:
            raise KeyboardInterrupt
        self.received = signum
        self.log(
            f"{signal.Signals(signum).name}: stopping after this update to save a checkpoint "
            "(again to stop at once)"
        )

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                if signal.getsignal(sig) is not signal.SIG_IGN:  # ignored stays ignored
                    self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
