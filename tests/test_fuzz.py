"""Fuzzing the doors: random shapes, dtypes, positions, head counts and values into the public
functions and modules, and mutated copies of the published configs into ``posemb inspect``.

The only allowed outcomes are a result, posemb's ``InputError`` naming what it refuses, or (on
the command line) exit status 2 with one line. Anything else (a ``RuntimeError`` from torch, a
``KeyError``, a traceback) is a door posemb left open.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posemb
from devices import device_of
from posemb import cli, kernels
from tolerances import assert_close

DATA = pathlib.Path(__file__).parent / "data" / "hf_configs"
CONFIGS = sorted(DATA.glob("*.json"))

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64]


def _only_refusals(call):
    """Run ``call``; an InputError is an allowed refusal, whose message must name something."""
    try:
        return call()
    except posemb.InputError as err:
        assert str(err).strip(), "an empty refusal"
        return None


@given(
    head_dim=st.sampled_from([0, 1, 2, 3, 8, 9, 64, -4]),
    rotary_dim=st.sampled_from([None, 0, 2, 3, 8, 64, 128]),
    base=st.sampled_from([10000.0, 1.0, 0.5, 0.0, -1.0, float("inf"), float("nan"), 1e30]),
    layout=st.sampled_from(["half", "interleaved", "other", 3]),
)
def test_rotary_embedding_construction(head_dim, rotary_dim, base, layout):
    _only_refusals(lambda: posemb.RotaryEmbedding(head_dim, base, rotary_dim, layout))


@settings(max_examples=120)
@given(
    batch=st.integers(0, 3),
    heads=st.integers(0, 4),
    kv_heads=st.integers(0, 4),
    seq=st.integers(0, 9),
    head_dim=st.sampled_from([2, 6, 8, 16]),
    dtype=st.sampled_from(DTYPES),
    pos_kind=st.sampled_from(["none", "arange", "batched", "negative", "float", "short", "huge"]),
    layout=st.sampled_from(["half", "interleaved"]),
    backend=st.sampled_from(["auto", "reference", "cpu"]),
)
def test_rotary_embedding_forward(
    batch, heads, kv_heads, seq, head_dim, dtype, pos_kind, layout, backend
):
    def call():
        rope = posemb.RotaryEmbedding(head_dim, layout=layout, backend=backend)
        dev = device_of(backend)
        q = torch.randn(batch, heads, seq, head_dim, device=dev).to(dtype)
        k = torch.randn(batch, kv_heads, seq, head_dim, device=dev).to(dtype)
        pos = {
            "none": None,
            "arange": torch.arange(seq, device=dev),
            "batched": torch.arange(seq, device=dev).expand(batch, seq),
            "negative": torch.arange(seq, device=dev) - 3,
            "float": torch.arange(seq, dtype=torch.float32, device=dev),
            "short": torch.arange(max(seq - 1, 0), device=dev),
            "huge": torch.arange(seq, device=dev) + (1 << 40),
        }[pos_kind]
        out_q, out_k = rope(q, k, pos)
        assert out_q.shape == q.shape and out_k.shape == k.shape
        assert out_q.dtype == q.dtype

    _only_refusals(call)


@settings(max_examples=120)
@given(
    shape=st.tuples(st.integers(0, 2), st.integers(0, 3), st.integers(0, 5), st.integers(0, 9)),
    kv=st.integers(0, 3),
    table=st.sampled_from(["ok", "wide", "batch3", "float64", "1d", "none", "int"]),
    dtype=st.sampled_from(DTYPES),
    inplace=st.booleans(),
    backend=st.sampled_from(["auto", "reference", "cpu", "triton", "nope"]),
)
def test_kernels_rotate(shape, kv, table, dtype, inplace, backend):
    b, h, s, d = shape

    def call():
        dev = device_of(backend)
        q = torch.randn(b, h, s, d, device=dev).to(dtype)
        k = torch.randn(b, kv, s, d, device=dev).to(dtype)
        half = max(d // 2, 1)
        cos = {
            "ok": torch.ones(1, s, half, device=dev),
            "wide": torch.ones(1, s, d + 2, device=dev),
            "batch3": torch.ones(3, s, half, device=dev),
            "float64": torch.ones(1, s, half, dtype=torch.float64, device=dev),
            "1d": torch.ones(half, device=dev),
            "none": None,
            "int": torch.ones(1, s, half, dtype=torch.int64, device=dev),
        }[table]
        sin = None if cos is None else torch.zeros_like(cos)
        return kernels.rotate(q, k, cos, sin, backend=backend, inplace=inplace)

    _only_refusals(call)


# --- a stateful module: dtypes, devices, attributes and tracing between calls (issue 30) --------

_POS_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
_MAX = {torch.uint8: 255, torch.int8: 127, torch.int16: 32767}
_SCALINGS = [
    None,
    posemb.scaling.Linear(2.0),
    posemb.scaling.DynamicNTK(2.0, 64),
    posemb.scaling.Yarn(4.0, 64),
    "yarn",
]
_STEP = st.one_of(
    st.tuples(
        st.just("call"),
        st.sampled_from(_POS_DTYPES),
        st.sampled_from(["cpu", "cpu", "meta"]),
        st.integers(0, 40000),
        st.booleans(),
    ),
    st.tuples(st.just("base"), st.sampled_from([10000.0, 500000.0, -1.0, 1.0])),
    st.tuples(st.just("rotary_dim"), st.sampled_from([4, 8, 16, 7, 32])),
    st.tuples(st.just("scaling"), st.sampled_from(_SCALINGS)),
    st.tuples(st.just("trace"), st.sampled_from(["fake", "vmap"])),
)


def _fresh_rotation(rope, q, pos):
    """What a module built now with ``rope``'s settings gives, on the reference backend."""
    fresh = posemb.RotaryEmbedding(
        16, base=rope.base, rotary_dim=rope.rotary_dim, scaling=rope.scaling, backend="reference"
    )
    return fresh(q, q, None if pos is None else pos.to(torch.int64))[0]


@settings(max_examples=60)
@given(steps=st.lists(_STEP, min_size=1, max_size=8), backend=st.sampled_from(["auto", "cpu"]))
def test_a_module_changed_and_traced_between_calls_answers_as_a_fresh_one(steps, backend):
    # Stale tables after base or rotary_dim changed, uint8 positions read as masks and fake
    # tensors cached by a traced call: every later eager call must equal a fresh module's.
    from torch._subclasses.fake_tensor import FakeTensorMode

    rope = posemb.RotaryEmbedding(16, backend=backend)
    q = torch.randn(1, 2, 4, 16, device=device_of(backend))
    for step in steps:
        kind = step[0]
        if kind == "call":
            _, dtype, device, offset, explicit = step
            top = _MAX.get(dtype, 1 << 20)
            start = offset % (top - 3)
            # cpu: the step's own device comes next (meta among them)
            pos = torch.tensor([start, start + 1, start + 1, start + 3], dtype=dtype)
            pos = pos.to(device) if explicit else None
            if explicit and device == "meta":
                with pytest.raises(posemb.InputError, match="meta device"):
                    rope(q, q, pos)
                continue
            assert_close(rope(q, q, pos)[0], _fresh_rotation(rope, q, pos), torch.float32)
        elif kind == "trace":
            if step[1] == "fake":
                with FakeTensorMode() as mode:
                    rope(mode.from_tensor(q), mode.from_tensor(q))
            else:
                torch.func.vmap(lambda x: rope(x, x)[0])(q[None].expand(2, -1, -1, -1, -1))
        else:
            before = getattr(rope, kind)
            try:
                setattr(rope, kind, step[1])
            except posemb.InputError:
                assert getattr(rope, kind) == before  # a refused value changes nothing
    assert_close(rope(q, q)[0], _fresh_rotation(rope, q, None), torch.float32)


@given(
    dim=st.sampled_from([-2, 0, 1, 2, 3, 64, 10**6]),
    base=st.sampled_from([10000.0, 1.0, 0.0, -5.0, float("nan"), "1e4", None]),
)
def test_frequencies(dim, base):
    _only_refusals(lambda: posemb.inv_freq(dim, base))
    _only_refusals(lambda: posemb.wavelengths(dim, base))


def _fuzz_script():
    """scripts/fuzz_configs.py, loaded by path: the mutations and the memory-limited run."""
    path = pathlib.Path(__file__).parent.parent / "scripts" / "fuzz_configs.py"
    spec = importlib.util.spec_from_file_location("fuzz_configs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _mutations(seed: int, count: int):
    """Copies of the published configs with one key dropped, renamed or given another value."""
    return _fuzz_script().mutations(seed, count, absurd=False)


MUTATIONS = int(os.environ.get("POSEMB_FUZZ_MUTATIONS", "300"))


def test_mutated_published_configs_are_read_or_refused_in_one_line(tmp_path, capsys):
    tried, refused = 0, 0
    for label, d in _mutations(seed=20, count=MUTATIONS):
        path = tmp_path / "config.json"
        path.write_text(json.dumps(d))
        try:
            status = cli.main(["inspect", str(path)])
        except Exception as err:  # the door left open: say which mutation
            pytest.fail(f"{label}: {type(err).__name__}: {err}")
        out = capsys.readouterr()
        assert status in (0, 2), label
        if status == 2:
            refused += 1
            lines = out.err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("posemb inspect: error:"), label
        tried += 1
    assert tried == MUTATIONS and 0 < refused < tried


def test_what_the_config_fuzz_found_before_the_fix(tmp_path, capsys):
    """Two doors 15,000 mutations found open: a YaRN beta of 1e308 (turns * 2 pi overflowed,
    math.log(0) in the ramp) and a rope_type that is a list (unhashable in the alias lookup)."""
    kimi = json.loads((DATA / "kimi_k2__kimi-k2-instruct.json").read_text())
    kimi["rope_scaling"]["beta_fast"] = 1e308
    path = tmp_path / "config.json"
    path.write_text(json.dumps(kimi))
    assert cli.main(["inspect", str(path)]) == 0  # every pair's ramp index is below 0: kept
    listed = json.loads((DATA / "mistral3__devstral-small-2-24b-instruct.json").read_text())
    listed["text_config"]["rope_parameters"]["rope_type"] = [1, 2]
    path.write_text(json.dumps(listed))
    assert cli.main(["inspect", str(path)]) == 2
    assert "['rope_type'] must be a string, got [1, 2]" in capsys.readouterr().err


DIFFERENTIAL = int(os.environ.get("POSEMB_FUZZ_DIFFERENTIAL", "200"))


def _transformers_reading(d: dict):
    """transformers' per-layer-type (inv_freq, attention factor) for ``d``, or None when its
    config class or rotary module refuses it."""
    import warnings

    hr = pytest.importorskip("hf_reference")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, ref = hr.hf_frequencies(hr.hf_config(copy.deepcopy(d)), None)
    except Exception:  # transformers refused it (its own error types, all of them)
        return None
    return ref or None


def test_where_posemb_and_transformers_both_read_a_mutated_config_they_agree():
    """The same mutated published configs into posemb and into transformers' config class and
    rotary module: where both accept one, every layer kind's frequencies and attention factor
    agree (a Gemma 2 without head_dim, a null partial_rotary_factor and a torch_dtype of 1e308
    were the silently wrong readings and the crash this found, now fixed)."""
    import warnings

    from posemb import hf

    hr = pytest.importorskip("hf_reference")
    both, disagree = 0, []
    for label, d in _mutations(seed=7, count=DIFFERENTIAL):
        mt = d.get("model_type")
        # Stand-ins read custom code's keys; files transformers itself misreads (GLM-4.1V's
        # top-level text keys) are compared in the nested form in test_hf_real_configs.
        if not isinstance(mt, str) or mt in hr.STAND_INS or mt in hr.NESTED_FOR_TRANSFORMERS:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = hf.model_rope(copy.deepcopy(d))
        except (posemb.InputError, ImportError):
            continue
        ref = _transformers_reading(d)
        if ref is None:
            continue
        both += 1
        for kind in model.kinds:
            if kind.spec is None:
                continue
            want = ref.get(kind.layer_type, ref.get(None))
            if want is None:
                continue
            spec = kind.spec
            inv, factor = spec.scaling.compute(spec.rotary_dim, spec.base, None)
            want_inv, want_factor = want
            if not bool(torch.isfinite(want_inv).all() and (want_inv > 0).all()):
                continue  # transformers' float32 failed (a base of 1e308); posemb's float64 not
            same = inv.shape == want_inv.shape and bool(
                ((inv - want_inv).abs() / want_inv.abs().clamp_min(1e-300)).max()
                <= hr.inv_freq_tolerance(spec.base)
            )
            if not same or abs(factor - want_factor) > 1e-9 * max(1.0, abs(want_factor)):
                disagree.append(f"{label} [{kind.layer_type}]")
    assert both >= DIFFERENTIAL // 4, both
    print(f"differential: {DIFFERENTIAL} mutations, {both} read by both")
    assert not disagree, disagree[:5]


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: posemb.inv_freq(1 << 40), "dim gives heads 1099511627776 channels wide"),
        (lambda: posemb.RotaryEmbedding(1 << 20), "head_dim gives heads 1048576 channels"),
        (lambda: posemb.scaling.Default().compute(1 << 34, 1e4), "rotary_dim gives heads"),
        (
            lambda: posemb.hf.model_rope(
                {"model_type": "llama", "hidden_size": 1 << 40, "num_attention_heads": 32,
                 "rope_theta": 1e4}
            ),
            r"hidden_size gives heads 34359738368 channels wide \(hidden_size / num_attention",
        ),
    ],
    ids=["inv_freq", "module", "scaling", "config"],
)  # fmt: skip
def test_absurd_head_widths_are_refused_before_anything_is_allocated(call, match):
    # A config with hidden_size 2^40 made posemb inspect ask torch for 137 GB and die with a
    # traceback (issue 32). Run under a 4 GB address-space limit would show the same.
    with pytest.raises(posemb.InputError, match=match):
        call()
    assert posemb.inv_freq(1 << 16).shape == (1 << 15,)  # the bound itself is served


ABSURD_MUTATIONS = int(os.environ.get("POSEMB_FUZZ_ABSURD", "300"))


def test_mutations_with_absurd_sizes_end_in_seconds_under_a_4gb_address_space(tmp_path):
    """scripts/fuzz_configs.py in its own process, limited to 4 GB of address space: each
    mutation (one in three an absurd size) ends in exit 0 or a one-line exit 2, none past 10 s.
    Before the bounds at the door, Gemma 3 with 2^40 layers looped in transformers' config class
    and never ended; 2,000 mutations (seeds 0-3) are the issue's figure."""
    script = pathlib.Path(__file__).parent.parent / "scripts" / "fuzz_configs.py"
    done = subprocess.run(
        [sys.executable, str(script), "--mutations", str(ABSURD_MUTATIONS), "--seed", "5",
         "--limit-gb", "4", "--json", "--folder", str(tmp_path)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["failures"] == 0 and report["slowest_s"] < 10, report
    assert set(report["statuses"]) == {"0", "2"}, report


@pytest.mark.parametrize(
    ("name", "path", "value", "match"),
    [
        ("gemma3__gemma-3-27b-it.json", ("text_config", "num_hidden_layers"), 1 << 40,
         r"text_config.num_hidden_layers is 1099511627776, past the most posemb accepts \(65,536"),
        ("qwen3__qwen3-8b.json", ("num_key_value_heads",), 1 << 62, "num_key_value_heads is"),
        ("llama__llama-3.1-8b-instruct.json", ("max_position_embeddings",), 1e300,
         r"max_position_embeddings is 1e\+300, past the most posemb accepts \(9,007,199"),
        ("phi3__phi-3-vision-128k-instruct.json", ("original_max_position_embeddings",), 1,
         "must be at least 2 for the default attention factor"),
    ],
    ids=["layers", "heads", "positions", "longrope-one-token"],
)  # fmt: skip
def test_what_the_absurd_size_fuzz_found(name, path, value, match):
    d = json.loads((DATA / name).read_text())
    parent = d
    for k in path[:-1]:
        parent = parent[k]
    parent[path[-1]] = value
    with pytest.raises(posemb.InputError, match=match):
        posemb.hf.model_rope(d)
