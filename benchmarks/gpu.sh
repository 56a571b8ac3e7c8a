#!/usr/bin/env bash
# The one GPU check: every test file with a CUDA or Triton parametrization, the four benches,
# a `posemb lab --preset gpu` smoke, the extension benchmark and the attention benchmark (every
# encoding against flash SDPA), each step under its own time limit, the
# whole under 6 minutes on one H200. It writes two files to $OUT (or ./gpu-results): one
# archive of everything the steps wrote, and summary.txt (each step's exit code and time,
# the tests' pass/fail counts and the benches' headline ratios), printed last. A step that
# fails or runs out of time does not stop the later ones.
#
#   benchmarks/gpu.sh            on a machine with a CUDA GPU (no network needed)
#   benchmarks/gpu.sh --dry-run  anywhere: every command parses and every file it names exists
#
# Optional comparison libraries (and pytest-xdist, which the tests use where installed) travel
# as wheels in .whl/ (carry it), fetched beforehand with
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl liger-kernel rotary-embedding-torch pytest-xdist execnet
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0
case "${1:-}" in
    --dry-run) DRY=1 ;;
    "") ;;
    *) echo "usage: benchmarks/gpu.sh [--dry-run]" >&2; exit 2 ;;
esac
OUT="${OUT:-$PWD/gpu-results}"
PY="${PYTHON:-python3}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

# Every test file with a CUDA or Triton parametrization (tests/devices.py's device_of).
TESTS=(tests/test_kernels.py tests/test_kernels_norm.py tests/test_kernels_fast.py
       tests/test_rope.py tests/test_bias.py tests/test_mrope.py tests/test_compile.py
       tests/test_hf_patch.py tests/test_hf_extension.py tests/test_hf_fused_norm.py
       tests/test_lab_memory.py tests/test_devices.py tests/test_gpu.py tests/test_fuzz.py
       tests/test_attention_flex.py tests/test_attention_core.py)

FAILED=0
LIMITS=0
# step NAME SECONDS COMMAND...: run it (its output to $WORK/NAME.txt), or in a dry run check it.
step() {
    local name=$1 limit=$2
    shift 2
    if [ "$DRY" = 1 ]; then
        check "$name" "$limit" "$@" || FAILED=1
        return
    fi
    local t0=$SECONDS rc=0
    echo "== $name (at most ${limit} s)"
    timeout --kill-after=10 "$limit" "$@" > "$WORK/$name.txt" 2>&1 || rc=$?
    tail -n 3 "$WORK/$name.txt"
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" "$limit" >> "$WORK/steps.tsv"
}

# A dry run's check of one step: the files it names exist, and posemb's arguments parse (all
# posemb steps at the end, in one Python: importing posemb takes seconds each time).
check() {
    local name=$1 limit=$2
    shift 2
    local arg ok=0
    case "$limit" in
        '' | *[!0-9]*) echo "$name: time limit '$limit' is not a number of seconds" >&2; ok=1 ;;
    esac
    LIMITS=$((LIMITS + ${limit//[!0-9]/0}))
    # Every step is "$PY -m posemb ...", "$PY -m pytest ..." or "$PY benchmarks/X.py ...":
    # what this check can read.
    if [ "${1:-}" = "$PY" ] && [[ "${2:-}" == benchmarks/*.py ]]; then
        [ -e "$2" ] || { echo "$name: no file $2" >&2; return 1; }
        "$PY" "$2" --parse-only "${@:3}" > /dev/null ||
            { echo "$name: $2 ${*:3} does not parse" >&2; return 1; }
        echo "ok   $name"
        return 0
    fi
    if [ "${1:-}" != "$PY" ] || [ "${2:-}" != "-m" ] || { [ "${3:-}" != posemb ] &&
        [ "${3:-}" != pytest ]; }; then
        echo "$name: '$*' is not \$PY -m posemb, \$PY -m pytest or \$PY benchmarks/X.py" >&2
        return 1
    fi
    for arg in "$@"; do
        case "$arg" in
            tests/*.py | benchmarks/*)
                [ -e "$arg" ] || { echo "$name: no file $arg" >&2; ok=1; } ;;
        esac
    done
    if [ "${2:-}" = "-m" ] && [ "${3:-}" = "posemb" ]; then
        shift 3
        # One record per step: its name, then its arguments, NUL-separated, "" after the last.
        [ "$ok" = 0 ] && printf "%s\0" "$name" "$@" "" >> "$WORK/parse"
        return "$ok"
    elif [ "${2:-}" = "-m" ] && [ "${3:-}" = "pytest" ]; then
        local files=()
        for arg in "$@"; do case "$arg" in tests/*.py) files+=("$arg") ;; esac; done
        "$PY" -m py_compile "${files[@]}" || ok=1
        # The flags (not the files: collecting them imports every library, ~20 s) through
        # pytest's own parser, on a file that collects nothing.
        local flags=()
        for arg in "${@:4}"; do case "$arg" in tests/*.py) ;; *) flags+=("$arg") ;; esac; done
        printf '' > "$WORK/test_nothing.py"
        "$PY" -m pytest --co -q -p no:cacheprovider "${flags[@]}" --rootdir "$WORK" \
            -c /dev/null "$WORK/test_nothing.py" > "$WORK/flags.txt" 2>&1
        [ $? -le 5 ] && ! grep -q "error: unrecognized arguments" "$WORK/flags.txt" ||
            { echo "$name: pytest flags do not parse: $(grep -m1 -i error "$WORK/flags.txt")" >&2; ok=1; }
    fi
    [ "$ok" = 0 ] && echo "ok   $name"
    return "$ok"
}

# The recorded posemb steps parsed by posemb's own parser; "ok   NAME" for each that does.
parse_recorded() {
    [ -e "$WORK/parse" ] || return 0
    "$PY" - "$WORK/parse" <<'PARSE_EOF'
import sys
from posemb.cli import build_parser

fields = open(sys.argv[1], "rb").read().decode().split("\0")[:-1]
failed, record = 0, []
for field in fields:
    if field:
        record.append(field)
        continue
    name, *args = record
    record = []
    try:
        build_parser().parse_args(args)
    except SystemExit:
        print(f"{name}: posemb {' '.join(args)} does not parse", file=sys.stderr)
        failed = 1
    else:
        print(f"ok   {name}")
sys.exit(failed)
PARSE_EOF
}

if [ "$DRY" = 0 ]; then
    mkdir -p "$OUT"
    if compgen -G ".whl/*.whl" > /dev/null; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/posemb-site .whl/*.whl
        export PYTHONPATH="$PYTHONPATH:/tmp/posemb-site"
    fi
    {
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
        "$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    } > "$WORK/machine.txt" 2>&1
fi
XDIST=()
if "$PY" -c "import xdist" 2> /dev/null; then XDIST=(-n 8); fi

# 1. Correctness on the GPU: each file's CUDA and Triton cases, opcheck's full checks on the
# Triton ops, CUDA-graph capture and no host sync (tests/test_gpu.py).
step tests 135 "$PY" -m pytest -q -p no:cacheprovider "${XDIST[@]}" "${TESTS[@]}"
# 2. The kernel alone: every shape, fp32 and bf16, forward, backward and both, against a copy.
step bench 40 "$PY" -m posemb bench --device cuda --out "$WORK/bench-gpu.csv"
# 3. Inside a transformers Llama, bf16: eager, patch_rotary, fused, Liger.
step bench-hf 35 "$PY" -m posemb bench --hf --device cuda --dtype bf16 --out "$WORK/bench-hf.csv"
# 4. Decode at Llama 3.1 8B's shapes, batch 1 and 8, per layer, per step and per model.
step bench-decode 35 "$PY" -m posemb bench --decode --device cuda --repeats 50 \
    --out "$WORK/bench-decode.csv"
# 5. QK-norm + RoPE at prefill shapes.
step bench-norm 25 "$PY" -m posemb bench --norm --device cuda --out "$WORK/bench-norm.csv"
# 6. The lab's GPU preset, cut to a smoke: a few steps of two variants, loss only.
step lab 25 "$PY" -m posemb lab --preset gpu --variants rope alibi --tasks lm --steps 40 \
    --out "$WORK/lab"
# 7. Training-free extension against RoPE + SDPA at issue 48's shapes, with peak memory.
step ext 25 "$PY" benchmarks/extension.py --device cuda --dtype bfloat16 --heads 32 \
    --kv-heads 8 --head-dim 128 --lengths 4096 16384 --repeats 3
# 8. Every encoding's attention (FlexAttention, else the blocked core) against flash SDPA at
#    issue 55's shapes: bf16, 16,384 tokens, 32 heads of 128, forward and forward+backward.
step attn 40 "$PY" benchmarks/attention.py --device cuda --dtype bfloat16 --heads 32 \
    --head-dim 128 --lengths 16384 --repeats 3

if [ "$DRY" = 1 ]; then
    parse_recorded || FAILED=1
    if [ "$LIMITS" -gt 360 ]; then
        echo "the steps' limits add up to $LIMITS s, over the 6 minutes promised" >&2
        FAILED=1
    fi
    "$PY" benchmarks/gpu_summary.py --check || FAILED=1
    if [ "$FAILED" = 0 ]; then echo "gpu.sh --dry-run: every step parses"; fi
    exit "$FAILED"
fi
"$PY" benchmarks/gpu_summary.py "$WORK" > "$WORK/summary.txt" 2>&1
cp "$WORK/summary.txt" "$OUT/summary.txt"
tar -czf "$OUT/gpu-results.tar.gz" -C "$WORK" .
cat "$OUT/summary.txt"
