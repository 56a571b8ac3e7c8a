"""The records every ``posemb bench`` writes, one dataclass per bench (a row of its CSV), and
the recogniser of their CSVs: below every bench, so any of them, and the old name of the
recogniser in :mod:`posemb.bench.hf`, can read them without importing one another."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass
class Row:
    """One measurement, a row of the long-format CSV."""

    shape_name: str
    shape: str
    dtype: str
    mode: str
    method: str
    median_ms: float
    p20_ms: float
    p80_ms: float
    gbps: float | None
    vs_bandwidth: float | None
    vs_hf_eager: float | None
    first_call_ms: float
    device: str
    device_name: str
    threads: int
    torch: str
    posemb: str
    transformers: str | None
    triton: str | None
    timestamp: str
    cpu_op: str | None = None
    """Where the CPU op came from and its instruction-set variant, e.g. ``"wheel avx2"``."""
    arch: str | None = None
    python: str | None = None
    rotary_embedding_torch: str | None = None
    liger_kernel: str | None = None
    flash_attn: str | None = None
    absent: str = ""
    """The peer libraries not installed in this run (so their methods have no rows)."""
    host_ms: float | None = None
    """Median until the call returned to Python (forward rows timed in pairs): on the CPU the
    whole call; on a GPU the host's share (checks, dispatch, launches)."""


@dataclass(kw_only=True)
class Machine:
    """Where and when a measurement ran (:func:`machine`'s keys), as fields of the rows of the
    benches added after 0.2 (``--decode``, ``--norm``); keyword-only, so a row's own fields
    keep their positions."""

    device: str
    device_name: str
    threads: int
    torch: str
    posemb: str
    transformers: str | None
    triton: str | None
    timestamp: str
    cpu_op: str | None = None
    arch: str | None = None
    python: str | None = None
    rotary_embedding_torch: str | None = None
    liger_kernel: str | None = None
    flash_attn: str | None = None
    absent: str = ""


# The columns added in 0.2 (the machine in full): a CSV written before them has none of them.
MACHINE_FIELDS = (
    "arch", "python", "rotary_embedding_torch", "liger_kernel", "flash_attn", "absent"
)  # fmt: skip


@dataclass
class HFRow:
    """One measurement of ``posemb bench --hf``."""

    part: str
    mode: str
    method: str
    median_ms: float
    p20_ms: float
    p80_ms: float
    vs_eager: float | None
    rotation_share: float | None
    """The rotation's time (part ``rotation``, same method and mode) over this step's time."""
    setup: str
    dtype: str
    device: str
    device_name: str
    threads: int
    torch: str
    transformers: str
    posemb: str
    timestamp: str
    cpu_op: str | None = None
    """Where the CPU op came from and its variant (what ``patch_rotary fused`` ran)."""
    arch: str | None = None
    python: str | None = None
    rotary_embedding_torch: str | None = None
    triton: str | None = None
    liger_kernel: str | None = None
    flash_attn: str | None = None
    absent: str = ""


@dataclass
class DecodeRow(Machine):
    """One measurement of ``posemb bench --decode``."""

    part: str
    batch: int
    dtype: str
    method: str
    median_us: float
    """Per call: per layer for ``layer``, per step for ``step`` and ``model``."""
    p20_us: float
    p80_us: float
    vs_transformers: float | None
    """Median over rounds of transformers' time over this method's (>1: faster)."""
    calls: int
    host_us: float = 0.0
    """Median per call until the call returned to Python (checks, dispatch, launches): on the
    CPU the whole call; on a GPU the host's share, the part a CUDA graph removes."""


@dataclass
class NormRow(Machine):
    """One measurement of ``posemb bench --norm``."""

    shape: str
    dtype: str
    mode: str
    method: str
    median_ms: float
    p20_ms: float
    p80_ms: float
    gbps: float | None
    vs_two_step: float | None
    """Median over rounds of ``rms_norm + rotate``'s time over this method's (>1: faster)."""
    vs_method: float | None
    """This method's time over the paired comparison's (``rotate alone`` forward, the compiled
    two steps forward+backward), median over rounds."""
    compared_with: str | None
    first_call_ms: float


def is_bench_csv(data: bytes) -> bool:
    """Whether a file's bytes are an earlier ``posemb bench --out`` CSV (of either kind): its
    first line is the header :func:`posemb.bench.kernels.write_csv` writes for them."""
    first = data.split(b"\n", 1)[0].rstrip(b"\r")
    # Each kind's header now, and as it was before each group of columns was added at its end
    # (newest last): the machine's columns (for --hf, with cpu_op and triton), then the host
    # time per call.
    added: dict[type, tuple[tuple[str, ...], ...]] = {
        Row: (MACHINE_FIELDS, ("host_ms",)),
        HFRow: ((*MACHINE_FIELDS, "cpu_op", "triton"),),
        DecodeRow: (("host_us",),),
        NormRow: (),
    }
    headers = set()
    for cls, groups in added.items():
        fields = [f.name for f in dataclasses.fields(cls)]
        headers.add(",".join(fields).encode())
        for i in range(len(groups)):
            dropped = {name for group in groups[i:] for name in group}
            headers.add(",".join(f for f in fields if f not in dropped).encode())
    return first in headers


__all__ = ["MACHINE_FIELDS", "DecodeRow", "HFRow", "Machine", "NormRow", "Row", "is_bench_csv"]
