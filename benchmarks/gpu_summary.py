"""The summary of a `benchmarks/gpu.sh` run: each step's exit code and time, the tests' pass and
fail counts, and the benches' headline ratios, each read from what the step wrote.

    python benchmarks/gpu_summary.py WORK     the summary of the run whose files are in WORK
    python benchmarks/gpu_summary.py --check  a dry run: the summary of an empty run

Ratios are paired: both sides come from the same run of the same bench. Targets (issue 47)
are printed beside them; a missing file or row reads "-", never a guess.
"""

from __future__ import annotations

import csv
import pathlib
import re
import statistics
import sys
import tempfile

COPY = "bandwidth: empty_like.copy_"


def _rows(path: pathlib.Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _median(rows: list[dict[str, str]], column: str, **where: str) -> float | None:
    values = [
        float(r[column])
        for r in rows
        if all(r.get(k) == v for k, v in where.items()) and r.get(column) not in (None, "")
    ]
    return statistics.median(values) if values else None


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def steps(work: pathlib.Path) -> list[str]:
    """One line per step: exit code (124: out of time), seconds and its limit."""
    path = work / "steps.tsv"
    if not path.exists():
        return ["no step ran"]
    lines = []
    for row in path.read_text().splitlines():
        name, rc, took, limit = row.split("\t")
        verdict = "ok" if rc == "0" else ("OUT OF TIME" if rc in ("124", "137") else "FAILED")
        lines.append(f"{name:14} exit {rc:>3}  {took:>4} s of {limit:>3}  {verdict}")
    return lines


def tests(work: pathlib.Path) -> str:
    """pytest's closing counts, as it printed them."""
    path = work / "tests.txt"
    if not path.exists():
        return "tests: not run"
    found = re.findall(
        r"^=*\s*(\d+ (?:passed|failed).*?)\s*(?:in [\d.]+s.*)?=*$", path.read_text(), re.M
    )
    return f"tests: {found[-1]}" if found else "tests: no closing line (stopped early?)"


def rotation(work: pathlib.Path) -> list[str]:
    """The Triton rotation at prefill against a device copy, Liger and torch.compile."""
    rows = _rows(work / "bench-gpu.csv")
    lines = []
    for dtype in ("fp32", "bf16"):
        sel = {"shape_name": "prefill", "dtype": dtype}
        copy = _median(rows, "median_ms", method=COPY, mode="forward", **sel)
        ours = {m: _median(rows, "median_ms", method="posemb triton", mode=m, **sel)
                for m in ("forward", "backward", "both")}  # fmt: skip
        liger = _median(rows, "median_ms", method="liger-kernel", mode="both", **sel)
        comp = _median(rows, "median_ms", method="torch.compile reference", mode="both", **sel)
        lines.append(
            f"rotation {dtype}: forward {_ratio(ours['forward'], copy)} of a copy, backward "
            f"{_ratio(ours['backward'], copy)} (target <= 1.2x); forward+backward "
            f"{_ratio(ours['both'], liger)} of Liger's time, {_ratio(ours['both'], comp)} of "
            f"torch.compile's (target < 1x)"
        )
    return lines


def decode(work: pathlib.Path) -> list[str]:
    """Decode: the fused patch per layer and per model step against transformers."""
    rows = _rows(work / "bench-decode.csv")
    lines = []
    for batch in ("1", "8"):
        parts = []
        for part in ("layer", "model", "qwen3"):
            v = _median(
                rows, "vs_transformers", part=part, batch=batch, method="patch_rotary fused"
            )
            parts.append(f"{part} {'-' if v is None else f'{v:.2f}x'}")
        lines.append(
            f"decode b{batch}, fused patch, speed vs transformers (target >= 1.0x): "
            + ", ".join(parts)
        )
        host = [
            f"{method} {'-' if v is None else f'{v:.1f}'}"
            for method in ("posemb kernels.rotate", "patch_rotary fused", "transformers")
            for v in [_median(rows, "host_us", part="layer", batch=batch, method=method)]
        ]
        lines.append(f"decode b{batch}, host us per layer call (target <= 25): " + ", ".join(host))
    return lines


def norm(work: pathlib.Path) -> list[str]:
    """norm_rotate against the two steps and the rotation alone."""
    rows = _rows(work / "bench-norm.csv")
    lines = []
    for dtype in ("fp32", "bf16"):
        sel = {"dtype": dtype, "mode": "forward", "method": "norm_rotate"}
        two = _median(rows, "vs_two_step", **sel)
        alone = _median(rows, "vs_method", compared_with="rotate alone", **sel)
        lines.append(
            f"norm_rotate {dtype} forward: {'-' if two is None else f'{two:.2f}x'} the speed of "
            f"rms_norm then rotate (target >= 1.3x), {'-' if alone is None else f'{alone:.2f}x'} "
            f"the rotation's time (target <= 1.2x)"
        )
    return lines


def extension(work: pathlib.Path) -> list[str]:
    """Each method's time against RoPE + SDPA at the longest length (target <= 3x)."""
    path = work / "ext.txt"
    found = re.findall(
        r"L=\s*(\d+) (\S+(?: rerope)?)\s.*?ratio\s+([\d.]+)x",
        path.read_text() if path.exists() else "",
    )
    if not found:
        return ["extension: -"]
    longest = max(int(n) for n, _, _ in found)
    parts = [f"{m} {r}x" for n, m, r in found if int(n) == longest]
    return [f"extension at {longest} tokens vs RoPE + SDPA (target <= 3x): " + ", ".join(parts)]


def attention(work: pathlib.Path) -> list[str]:
    """Each encoding's time against causal flash SDPA at the longest length (issue 55's
    targets: forward <= 1.3x, forward and backward <= 1.6x)."""
    path = work / "attn.txt"
    found = re.findall(
        r"^\s*(forward|both)\s+L=\s*(\d+) (\S+)\s.*?ratio\s+([\d.]+)x",
        path.read_text() if path.exists() else "",
        re.M,
    )
    if not found:
        return ["attention: -"]
    longest = max(int(n) for _, n, _, _ in found)
    lines = []
    for mode, target in (("forward", "1.3x"), ("both", "1.6x")):
        parts = [f"{e} {r}x" for m, n, e, r in found if m == mode and int(n) == longest]
        if parts and not all(p.startswith("plain") for p in parts):
            parts = [p for p in parts if not p.startswith("plain")]
            lines.append(
                f"attention {mode} at {longest} tokens vs flash SDPA (target <= {target}): "
                + ", ".join(parts)
            )
    return lines or ["attention: -"]


def summary(work: pathlib.Path) -> str:
    """The whole summary of the run in ``work``."""
    machine = (work / "machine.txt").read_text().strip() if (work / "machine.txt").exists() else ""
    parts = [
        "posemb benchmarks/gpu.sh",
        machine or "machine: -",
        *steps(work),
        tests(work),
        *rotation(work),
        *decode(work),
        *norm(work),
        *extension(work),
        *attention(work),
    ]
    return "\n".join(parts)


def main(argv: list[str]) -> int:
    if argv == ["--check"]:
        with tempfile.TemporaryDirectory() as empty:
            summary(pathlib.Path(empty))
        print("ok   summary")
        return 0
    if len(argv) != 1 or not pathlib.Path(argv[0]).is_dir():
        print("usage: gpu_summary.py WORK | --check", file=sys.stderr)
        return 2
    print(summary(pathlib.Path(argv[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
