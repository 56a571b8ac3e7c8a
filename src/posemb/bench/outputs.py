"""What ``posemb bench --out`` writes, recognised: the one module that knows every bench's row
type (each bench knows only its own, and the shared ones below it)."""

from __future__ import annotations

import dataclasses

from .decode import DecodeRow
from .hf import HFRow
from .kernels import MACHINE_FIELDS, Row
from .norm import NormRow


def is_bench_csv(data: bytes) -> bool:
    """Whether a file's bytes are an earlier ``posemb bench --out`` CSV (of either kind): its
    first line is the header :func:`posemb.bench.kernels.write_csv` writes for them."""
    first = data.split(b"\n", 1)[0].rstrip(b"\r")
    # Each kind's header now, and before the machine's columns (for --hf, with cpu_op and
    # triton) were added at its end.
    added: dict[type, tuple[str, ...]] = {
        Row: MACHINE_FIELDS,
        HFRow: (*MACHINE_FIELDS, "cpu_op", "triton"),
        DecodeRow: (),
        NormRow: (),
    }
    headers = set()
    for cls, new in added.items():
        fields = [f.name for f in dataclasses.fields(cls)]
        headers.add(",".join(fields).encode())
        headers.add(",".join(f for f in fields if f not in new).encode())
    return first in headers


__all__ = ["is_bench_csv"]
