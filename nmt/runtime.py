"""Where and how training runs: device, precision, autocast, seeding, torch.distributed."""

from __future__ import annotations

import contextlib
import os
import random
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist

from nmt.config import DEVICES, is_device_name
from nmt.errors import NmtError

Precision = Literal["fp32", "bf16", "fp16"]
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(
    name: str, local_rank: int = 0, *, setting: str = "train.device"
) -> torch.device:
    """`auto` = the local rank's GPU when there is one, else the CPU. `setting` names where
    the value came from (a config key or a flag) in errors."""
    if not is_device_name(name):
        raise NmtError(f"{setting} {name!r}: expected {DEVICES}")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise NmtError(f"{setting}: {name!r} asked for, but no CUDA GPU is available")
        if name == "cuda":
            name = f"cuda:{local_rank}"
        index = int(name.split(":")[1])
        if index >= torch.cuda.device_count():
            raise NmtError(f"{setting}: {name!r}, but only {torch.cuda.device_count()} GPU(s)")
    return torch.device(name)


def cpu_has_bf16_matmul() -> bool:
    """True where oneDNN runs bf16 matrix products natively (AVX512-BF16 or AMX)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


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
            return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        return "bf16" if cpu_has_bf16_matmul() else "fp32"
    if precision == "fp16" and device.type == "cpu":
        raise NmtError(f"{setting}: fp16 needs a GPU; use bf16 or fp32 on the CPU")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise NmtError(f"{setting}: this GPU has no bf16 support; use fp16 or fp32")
    return precision  # type: ignore[return-value]


def autocast(device: torch.device, precision: Precision) -> contextlib.AbstractContextManager:
    """Mixed-precision context for the forward pass and loss (a no-op in fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=_DTYPES[precision])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def configure_device(device: torch.device, threads: int | None) -> None:
    """Per-process settings: CPU threads; on GPUs cuDNN autotuning for RNNs and TF32 matmuls."""
    if threads is not None:
        torch.set_num_threads(threads)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


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


def init_distributed(device_name: str) -> Distributed:
    """Join the process group that `torchrun` describes in the environment, if any:
    NCCL between GPUs, gloo between CPU processes."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Distributed()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    wants_gpu = device_name != "cpu" and torch.cuda.is_available()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if wants_gpu else "gloo")
    return Distributed(rank=rank, world=world, local_rank=local_rank)


def shutdown_distributed(ctx: Distributed) -> None:
    if ctx.enabled and dist.is_initialized():
        dist.destroy_process_group()
