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


__all__ = ["is_bench_csv"]
