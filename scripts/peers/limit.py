"""The machine's own limit for a model: how many target tokens a second its matrix products
alone would allow, in a precision, on the machine at hand.

One training step of the model (forward and backward, through the same fused paths
training takes) runs under a dispatch mode that records every matrix product it issues:
`mm`, `addmm`, `bmm`, `baddbmm` and oneDNN's `_linear_pointwise` (`nmt.onednn`) with their
shapes. Each distinct product is then timed alone in the precision (bf16: bf16 operands, as
autocast gives them), a 2-D one both through torch's `mm` and through oneDNN, keeping the
faster: the limit is what the machine's libraries can do, not what one of them does (on AMD
CPUs torch's float32 `mm` takes MKL's generic path, 2.2× slower than oneDNN on Zen 5). The
step's products take `sum(count x time)`: the limit is the step's target tokens over that
time. Everything
else a step does (elementwise operators, the loss, the optimizer, Python) counts as
overhead, so a run's tokens/s divided by the limit is the share of the step the matrix
units are busy: the figure issue 25 asks for, next to each row's ratio to a peer.

    .venv/bin/python scripts/peers/limit.py configs/reference_rnn.yaml --precision fp32 bf16

On a GPU (`--device cuda`) the same products are timed there in fp32 (TF32, as nmt trains),
bf16 and fp16, each timing a run of several products closed by a device synchronisation
(one product alone would time the launch). The shapes are the CPU step's: the fused CPU
loops and cuDNN's RNNs do the same arithmetic, in products of the same sizes or larger.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: argtypes

from argtypes import whole  # noqa: E402

from nmt import onednn, typed  # noqa: E402
from nmt.batching import collate  # noqa: E402
from nmt.config import Config, load_config  # noqa: E402
from nmt.errors import one_line  # noqa: E402
from nmt.model import build_model  # noqa: E402
from nmt.runtime import DTYPES, configure_device, cpuinfo  # noqa: E402
from nmt.step import token_loss  # noqa: E402

_PRODUCTS = {"mm", "addmm", "bmm", "baddbmm"}
ROUNDS = 3  # timings of each product, the fastest kept (`limit`)
REPEATS = 20  # on a GPU, products a timing queues before it waits for them
# A product's timing: WARM_UPS runs first, then at least TIMINGS timed runs, the median kept
WARM_UPS, TIMINGS = 3, 5
# CPU features that decide a product's speed, as lscpu/proc name them: float and bf16
# products, then int8 decoding's (VNNI) and AMX's fp16. Runs before session 41 named the
# first seven only, and no family and model (`Cpu.differs`).
_FLAGS = (
    *("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"),
    *("avx512_vnni", "avx_vnni", "amx_fp16"),
)
_FLAGS_BEFORE_ID = _FLAGS[:7]


@dataclass(frozen=True)
class Cpu:
    """The CPU a run measured on, as compare_peers' JSON records it ("cpu", "cpu_id",
    "cpu_flags"). Under a hypervisor the model name can be as bare as "AMD EPYC", the same
    for a Zen 4 and a Zen 5 whose products run at half and full rate: the family and model
    numbers tell them apart."""

    name: str
    id: str | None  # "family 25, model 17"; None in a run from before session 41
    flags: tuple[str, ...]  # those of _FLAGS it has, in that order

    def __str__(self) -> str:
        said = f"{self.name} ({self.id})" if self.id else self.name
        return f"{said}; flags: {' '.join(self.flags) or 'unknown'}"

    @property
    def family(self) -> str | None:
        """The "family 25" of `id` (`this_cpu` writes "family F, model M"); None without one."""
        return self.id.split(",")[0] if self.id else None

    def differs(self, here: Cpu) -> bool:
        """Whether this run's CPU is another than `here`, as far as the run recorded it."""
        if self.id is None:  # what an older run named: its name and the first seven flags
            here = Cpu(here.name, None, tuple(f for f in here.flags if f in _FLAGS_BEFORE_ID))
        return self != here


def this_cpu() -> Cpu:
    """This machine's CPU (Linux /proc/cpuinfo; "unknown CPU" elsewhere)."""
    present = set(cpuinfo("flags").split())
    family, model = cpuinfo("cpu family"), cpuinfo("model")
    return Cpu(
        cpuinfo("model name") or "unknown CPU",
        f"family {family}, model {model}" if family and model else None,
        tuple(f for f in _FLAGS if f in present),
    )


@dataclass(frozen=True)
class Product:
    """A matrix product a step issues: (b batches of) m x k times k x n."""

    op: str
    b: int
    m: int
    k: int
    n: int

    @property
    def flops(self) -> int:
        return 2 * self.b * self.m * self.k * self.n


def product_of(func, args: tuple) -> Product | None:  # noqa: ANN001
    """The matrix product an ATen call (as a dispatch mode sees it) makes, or None."""
    name = func.overloadpacket.__name__
    if name == "_linear_pointwise":  # x (M, K) times weight (N, K) transposed
        x, w = args[0], args[1]
        return Product("mm", 1, x.shape[0], x.shape[1], w.shape[0])
    if name not in _PRODUCTS:
        return None
    a, b = (args[1], args[2]) if name in ("addmm", "baddbmm") else (args[0], args[1])
    if a.dim() == 2:
        return Product("mm", 1, a.shape[0], a.shape[1], b.shape[1])
    return Product("bmm", a.shape[0], a.shape[1], a.shape[2], b.shape[2])


class _Record(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: collections.Counter[Product] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        product = product_of(func, args)
        if product is not None:
            self.seen[product] += 1
        return func(*args, **(kwargs or {}))


def step_products(
    cfg: Config, *, vocab: int, src_len: int, tgt_len: int
) -> tuple[collections.Counter[Product], int]:
    """The products of one training step on a batch of `train.batch_size` sentences of
    `src_len` / `tgt_len` pieces, and the batch's target tokens (EOS included)."""
    torch.manual_seed(0)
    model = build_model(cfg.model, src_vocab_size=vocab, tgt_vocab_size=vocab, shared_vocab=True)
    model.train()
    b = cfg.train.batch_size
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, vocab, (b, src_len), generator=g).tolist()
    tgt = torch.randint(4, vocab, (b, tgt_len), generator=g).tolist()
    batch = collate(src, tgt, range(b))
    with _Record() as record:
        out = model(batch.src, batch.src_lens, batch.tgt_in)
        token_loss(out, batch.tgt_out, cfg.train.label_smoothing).backward()
    return record.seen, batch.n_tgt_tokens


def time_product(p: Product, dtype: torch.dtype, device: torch.device) -> tuple[float, str]:
    """Median seconds of one such product with `dtype` operands on `device`, and the library
    that ran it faster: on a CPU a 2-D product through torch's `mm` and through oneDNN, a
    batched one through torch's `bmm`; on a GPU torch's (cuBLAS)."""
    a, b = operands(p, dtype, device)
    return min((median_seconds(run, a, b), library) for library, run in libraries(p, a, b))


def operands(p: Product, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
    """Random `dtype` operands of `p` on `device`: (b of) m x k and k x n."""
    shape_a = (p.m, p.k) if p.op == "mm" else (p.b, p.m, p.k)
    shape_b = (p.k, p.n) if p.op == "mm" else (p.b, p.k, p.n)
    return (
        torch.randn(shape_a).to(device=device, dtype=dtype),
        torch.randn(shape_b).to(device=device, dtype=dtype),
    )


def libraries(
    p: Product, a: Tensor, b: Tensor
) -> list[tuple[str, Callable[[Tensor, Tensor], Tensor]]]:
    """The ways `time_product` runs `p` on `operands` a and b, by library name."""
    if p.op != "mm":
        return [("torch", torch.bmm)]
    ways: list[tuple[str, Callable[[Tensor, Tensor], Tensor]]] = [("torch", torch.mm)]
    if onednn.available and a.device.type == "cpu":
        w = b.t().contiguous()  # (N, K), as a layer's weight is stored
        ways.append(("oneDNN", lambda x, _: onednn.pointwise(x, w)))
    return ways


def median_seconds(
    product: Callable[[Tensor, Tensor], Tensor], a: Tensor, b: Tensor, budget: float = 0.15
) -> float:
    """Median seconds of `product(a, b)` over about `budget` seconds, after WARM_UPS runs and
    at least TIMINGS timings (budget 0: exactly TIMINGS). On a GPU each timing is REPEATS
    products closed by a synchronisation: the products are queued, and only the wait for the
    last one says when they are done."""
    gpu = a.device.type == "cuda"
    repeats = REPEATS if gpu else 1

    def timed() -> float:
        start = time.perf_counter()
        for _ in range(repeats):
            product(a, b)
        if gpu:
            torch.cuda.synchronize(a.device)
        return (time.perf_counter() - start) / repeats

    for _ in range(WARM_UPS):
        timed()
    times: list[float] = []
    until = time.perf_counter() + budget
    while len(times) < TIMINGS or (time.perf_counter() < until and len(times) < 200):
        times.append(timed())
    return statistics.median(times)


@dataclass
class Limit:
    precision: str
    tokens_per_s: float = typed.option(dataclasses.MISSING, min=0)  # the products alone
    gflops: float  # their rate at this model's shapes
    mflop_per_token: float  # forward and backward
    products: int  # a step's products, all shapes
    # which library ran the step's products faster, by share of their time ("": a run
    # from before session 18, when torch's own products alone were timed)
    library: str = ""
    device: str = "cpu"  # where the products were timed ("cuda": the GPU nmt trains on)
    # GFLOP/s of each pass on its own, where the limit is the fastest timings over several
    # (`Timings.merged`: a shared machine's products ran 2.4x apart within 20 minutes)
    passes: list[float] = field(default_factory=list)


def limit_key(precision: str, device: str = "cpu") -> str:
    """The name a limit goes by in compare_peers' table and JSON: its precision on the CPU
    ("fp32", "bf16", as every run before GPUs named them), "cuda fp16" and the like on a GPU."""
    return precision if device == "cpu" else f"{device} {precision}"


@dataclass(frozen=True)
class Timings:
    """A step's products timed in one precision on one device: each product's fastest
    timing (seconds, library) over the passes merged into it, and each pass's own rate."""

    precision: str
    device: str
    seen: collections.Counter[Product]  # a step's products, with their counts
    tokens: int  # the step's target tokens
    best: dict[Product, tuple[float, str]]
    passes: tuple[float, ...]  # GFLOP/s of each pass on its own

    def merged(self, other: Timings) -> Timings:
        """Both passes' timings, each product's faster kept: noise only slows a product, so
        the fastest seen is the nearest to what the machine can do."""
        assert (self.precision, self.device, self.seen) == (
            other.precision,
            other.device,
            other.seen,
        )
        best = {p: min(t, other.best[p]) for p, t in self.best.items()}
        return Timings(
            self.precision, self.device, self.seen, self.tokens, best, self.passes + other.passes
        )

    def limit(self) -> Limit:
        by_library: collections.Counter[str] = collections.Counter()
        for p, count in self.seen.items():
            t, library = self.best[p]
            by_library[library] += count * t
        seconds = sum(by_library.values())
        flops = sum(count * p.flops for p, count in self.seen.items())
        return Limit(
            precision=self.precision,
            tokens_per_s=self.tokens / seconds,
            gflops=flops / seconds / 1e9,
            mflop_per_token=flops / self.tokens / 1e6,
            products=sum(self.seen.values()),
            library=", ".join(f"{n} {t / seconds:.0%}" for n, t in by_library.most_common()),
            device=self.device,
            passes=list(self.passes),
        )


def time_step(
    cfg: Config,
    precision: str,
    *,
    vocab: int,
    src_len: int = 16,
    tgt_len: int = 16,
    device: torch.device = torch.device("cpu"),
) -> Timings:
    """One pass: every product of a step of `cfg`'s model timed in `precision` (fp32, bf16;
    fp16 on a GPU) on `device`."""
    if device.type == "cpu" and precision == "fp16":
        raise ValueError("fp16 is for GPUs: nmt trains in fp32 or bf16 on a CPU")
    seen, tokens = step_products(cfg, vocab=vocab, src_len=src_len, tgt_len=tgt_len)
    dtype = DTYPES[precision]
    if device.type == "cuda":
        configure_device(device)  # TF32 for fp32 products, as nmt's training has it
    # Each product is timed in ROUNDS rounds over all of them and keeps its fastest: a slow
    # spell of a shared machine then spoils one round of a product, not the limit. With one
    # round, three back-to-back measurements of the bf16 limit gave 825, 958 and 895 GFLOP/s.
    best: dict[Product, tuple[float, str]] = {}
    for _ in range(ROUNDS):
        for p in seen:
            timed = time_product(p, dtype, device)
            best[p] = min(best.get(p, timed), timed)
    alone = Timings(precision, device.type, seen, tokens, best, ())
    return dataclasses.replace(alone, passes=(alone.limit().gflops,))


def timed_pass(
    cfg: Config, wanted: list[tuple[torch.device, str]], timings: dict[str, Timings]
) -> None:
    """One pass (`time_step`) for each (device, precision) of `wanted`, merged into
    `timings` by limit key (each product keeps its fastest timing over the passes); prints
    the limit so far with each pass's own rate."""
    for device, precision in wanted:
        key = limit_key(precision, device.type)
        timed = time_step(cfg, precision, vocab=cfg.tokenizer.vocab_size, device=device)
        timings[key] = timings[key].merged(timed) if key in timings else timed
        lim = timings[key].limit()
        print(
            f"limit {key}: {lim.gflops:,.0f} GFLOP/s at the model's shapes x "
            f"{lim.mflop_per_token:.1f} MFLOP a target token = {lim.tokens_per_s:,.0f} tok/s "
            f"(time by library: {lim.library}; passes so far: "
            f"{', '.join(f'{g:,.0f}' for g in lim.passes)} GFLOP/s)",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("config", type=Path)
    ap.add_argument("--precision", nargs="+", default=["fp32"], choices=list(DTYPES))
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    # ids 4 and up are pieces (0-3: pad, unk, bos, eos), so a vocabulary has at least one
    ap.add_argument("--vocab", type=whole(5), help="default: the config's tokenizer.vocab_size")
    ap.add_argument("--src-len", type=whole(1), default=16)
    ap.add_argument("--tgt-len", type=whole(1), default=16)
    args = ap.parse_args()
    with one_line():
        cfg = load_config(args.config)
    vocab = args.vocab or cfg.tokenizer.vocab_size
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: torch sees no GPU on this machine")
    if device.type == "cpu" and "fp16" in args.precision:
        sys.exit("--precision fp16: fp16 is for GPUs (--device cuda)")
    print(f"{this_cpu()}; {torch.get_num_threads()} threads")
    if device.type == "cuda":
        print(f"GPU: {torch.cuda.get_device_name(device)}")
    for precision in args.precision:
        timed = time_step(
            cfg, precision, vocab=vocab, src_len=args.src_len, tgt_len=args.tgt_len, device=device
        )
        lim = timed.limit()
        print(
            f"{args.config} {limit_key(precision, device.type)}: {lim.gflops:,.0f} GFLOP/s at "
            "the model's shapes, "
            f"{lim.mflop_per_token:.1f} MFLOP a target token: a limit of "
            f"{lim.tokens_per_s:,.0f} target tokens/s ({lim.products} products a step; "
            f"time by library: {lim.library})"
        )


if __name__ == "__main__":
    main()
