"""benchmarks/gpu.sh, the one GPU check, on a machine without a GPU: its --dry-run parses every
command and finds every file it names (and fails where one is missing or a flag is wrong), and
its summary reads each step's exit code, the tests' counts and the benches' paired ratios."""

import csv
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_summary  # noqa: E402


def _dry_run(root):
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(
        ["bash", str(root / "benchmarks" / "gpu.sh"), "--dry-run"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip


def test_the_dry_run_parses_every_step():
    done = _dry_run(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    steps = ("tests", "bench", "bench-hf", "bench-decode", "bench-norm", "lab", "attn")
    for step in (*steps, "summary"):
        assert f"ok   {step}\n" in done.stdout
    assert done.stdout.rstrip().endswith("gpu.sh --dry-run: every step parses")


def test_the_dry_run_fails_on_a_missing_test_file_or_a_wrong_flag(tmp_path):
    copy = tmp_path / "repo"
    (copy / "benchmarks").mkdir(parents=True)
    shutil.copytree(ROOT / "tests", copy / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    for script in ("gpu_summary.py", "extension.py", "attention.py", "measure.py"):
        shutil.copy(ROOT / "benchmarks" / script, copy / "benchmarks")
    script = (ROOT / "benchmarks" / "gpu.sh").read_text()
    (copy / "tests" / "test_bias.py").unlink()
    (copy / "benchmarks" / "gpu.sh").write_text(script.replace("--repeats 50", "--repeatz 50"))
    done = _dry_run(copy)
    assert done.returncode != 0
    assert "tests: no file tests/test_bias.py" in done.stderr
    assert "bench-decode: posemb" in done.stderr and "does not parse" in done.stderr
    assert "every step parses" not in done.stdout


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        (
            '-p no:cacheprovider "${XDIST',
            '--maxfial 3 -p no:cacheprovider "${XDIST',
            "tests: pytest flags do not parse",
        ),
        ("step bench-norm 25", "step bench-norm abc", "bench-norm: time limit 'abc' is not"),
        ('step lab 25 "$PY"', 'step lab 25 timeot "$PY"', "lab: 'timeot"),
        ("step tests 135", "step tests 235", "limits add up to 460 s"),
        ("--kv-heads 8 --head-dim", "--kv-heads 8 --head-dimm", "ext: benchmarks/extension.py"),
    ],
    ids=["pytest-flag", "limit", "command", "six-minutes", "script-flag"],
)
def test_the_dry_run_fails_on_each_kind_of_mistake(tmp_path, old, new, said):
    copy = tmp_path / "repo"
    (copy / "benchmarks").mkdir(parents=True)
    shutil.copytree(ROOT / "tests", copy / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    for script in ("gpu_summary.py", "extension.py", "attention.py", "measure.py"):
        shutil.copy(ROOT / "benchmarks" / script, copy / "benchmarks")
    script = (ROOT / "benchmarks" / "gpu.sh").read_text()
    assert old in script
    (copy / "benchmarks" / "gpu.sh").write_text(script.replace(old, new))
    done = _dry_run(copy)
    assert done.returncode != 0 and said in done.stderr, done.stderr
    assert "every step parses" not in done.stdout


def _csv(path, rows):
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=sorted({k for r in rows for k in r}))
        w.writeheader()
        w.writerows(rows)


def test_the_summary_reads_exit_codes_counts_and_paired_ratios(tmp_path):
    (tmp_path / "steps.tsv").write_text("tests\t1\t140\t150\nbench\t124\t50\t50\nlab\t0\t31\t60\n")
    (tmp_path / "tests.txt").write_text(
        "....F\n=== 3 failed, 1200 passed, 12 skipped in 131.2s ===\n"
    )
    sel = {"shape_name": "prefill", "dtype": "bf16"}
    _csv(tmp_path / "bench-gpu.csv", [
        {**sel, "mode": "forward", "method": gpu_summary.COPY, "median_ms": "0.1"},
        {**sel, "mode": "forward", "method": "posemb triton", "median_ms": "0.11"},
        {**sel, "mode": "backward", "method": "posemb triton", "median_ms": "0.13"},
        {**sel, "mode": "both", "method": "posemb triton", "median_ms": "0.5"},
        {**sel, "mode": "both", "method": "liger-kernel", "median_ms": "1.0"},
        {**sel, "mode": "both", "method": "torch.compile reference", "median_ms": "0.25"},
    ])  # fmt: skip
    _csv(tmp_path / "bench-decode.csv", [
        {"part": "layer", "batch": "1", "method": "patch_rotary fused", "vs_transformers": "1.5"},
        {"part": "model", "batch": "8", "method": "patch_rotary fused", "vs_transformers": "0.9"},
        {"part": "layer", "batch": "1", "method": "posemb kernels.rotate", "host_us": "21.5"},
    ])  # fmt: skip
    (tmp_path / "ext.txt").write_text(
        "extended_attention [fused (LSE-merged)] vs RoPE + SDPA (causal), bfloat16, ...\n"
        "  L=  4096 selfextend     9.0 ms   plain     1.0 ms   ratio  9.00x\n"
        "  L= 16384 selfextend    30.0 ms   plain    10.0 ms   ratio  3.10x   peak 1.0 MiB\n"
        "  L= 16384 leaky rerope  20.0 ms   plain    10.0 ms   ratio  2.00x\n"
    )
    text = gpu_summary.summary(tmp_path)
    assert "at 16384 tokens vs RoPE + SDPA (target <= 3x): selfextend 3.10x, leaky rerope" in text
    assert "tests          exit   1   140 s of 150  FAILED" in text
    assert "bench          exit 124    50 s of  50  OUT OF TIME" in text
    assert "lab            exit   0    31 s of  60  ok" in text
    assert "tests: 3 failed, 1200 passed, 12 skipped" in text
    assert "rotation bf16: forward 1.10x of a copy, backward 1.30x" in text
    assert "0.50x of Liger's time, 2.00x of torch.compile's" in text
    assert "decode b1, host us per layer call (target <= 25): posemb kernels.rotate 21.5" in text
    assert "rotation fp32: forward - of a copy" in text  # no rows: said, not guessed
    assert "decode b1, fused patch, speed vs transformers (target >= 1.0x): layer 1.50x" in text
    assert "decode b8" in text and "model 0.90x" in text
    assert "norm_rotate fp32 forward: - the speed" in text
