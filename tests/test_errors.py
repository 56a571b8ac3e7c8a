"""One exception type for input posemb refuses, and a command line that tells a refusal (exit 2,
one line) from a bug (a traceback, exit 1); transformers' own errors are chained, not
rewritten; and the readings a differential fuzz against transformers found wrong."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch

import posemb
from posemb import cli, hf, kernels


@pytest.mark.parametrize(
    "call",
    [
        lambda: posemb.inv_freq(7),
        lambda: posemb.RotaryEmbedding(64, base=-1.0),
        lambda: kernels.rotate(torch.zeros(1, 1, 2, 8), torch.zeros(1, 1, 2, 8), None, None),
        lambda: posemb.MRotaryEmbedding(64, mrope_section=[1, 1, 1]),
        lambda: hf.rope_spec({"model_type": "llama", "rope_theta": -1, "head_dim": 64}),
        lambda: posemb.AlibiBias(0),
    ],
    ids=["inv_freq", "rope", "rotate", "mrope", "hf", "alibi"],
)
def test_refused_input_is_an_input_error_and_still_a_value_error(call):
    with pytest.raises(posemb.InputError) as caught:
        call()
    assert isinstance(caught.value, ValueError)


def test_an_unavailable_backend_is_an_input_error_and_still_a_runtime_error(monkeypatch):
    from posemb.kernels import cpu

    monkeypatch.setattr(cpu, "unavailable_reason", lambda: "no compiler (injected)")
    q = torch.zeros(1, 1, 2, 8)
    with pytest.raises(posemb.BackendUnavailable) as caught:
        kernels.rotate(q, q, torch.ones(1, 2, 4), torch.zeros(1, 2, 4), backend="cpu")
    assert isinstance(caught.value, RuntimeError) and isinstance(caught.value, posemb.InputError)


@pytest.mark.parametrize("error", [KeyError("internal"), ValueError("a plain ValueError")])
def test_a_bug_is_not_shown_as_the_users_mistake(monkeypatch, error):
    def broken(args):
        raise error

    monkeypatch.setattr(cli, "_cmd_kernels", broken)
    with pytest.raises(type(error)):
        cli.main(["kernels"])


def test_a_bug_gives_a_traceback_and_exit_status_1():
    code = (
        "import sys\n"
        "from posemb import cli\n"
        "def broken(args):\n"
        "    raise KeyError('injected')\n"
        "cli._cmd_kernels = broken\n"
        "sys.exit(cli.main(['kernels']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "KeyError: 'injected'" in done.stderr


def test_refused_input_is_one_line_and_exit_status_2(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama", "rope_theta": -5, "head_dim": 64}')
    assert cli.main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("posemb inspect: error:") and "\n" not in err


def test_a_config_transformers_refuses_is_chained_not_rewritten():
    d = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 2}
    d["num_key_value_heads"] = "x"  # no rope_theta: posemb asks the class, which refuses
    with pytest.raises(posemb.InputError, match="cannot build its config") as caught:
        hf.rope_spec(d)
    assert "num_key_value_heads" in str(caught.value.__cause__)


# What a differential fuzz of published configs against transformers found (issue 20).
transformers = pytest.importorskip("transformers")


def _quiet_config(model_type: str, d: dict):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.AutoConfig.for_model(model_type, **d)


def test_a_missing_head_dim_is_the_class_default_where_the_class_has_its_own():
    # Gemma 2 2B without head_dim: 2304 / 8 = 288, but Gemma2Config's head_dim is 256.
    d = {"hidden_size": 2304, "num_attention_heads": 8, "num_key_value_heads": 4}
    spec = hf.rope_spec({"model_type": "gemma2", "rope_theta": 10000.0, **d})
    assert spec.head_dim == _quiet_config("gemma2", d).head_dim == 256
    # Llama's class derives it, and posemb does too (no transformers needed for that).
    spec = hf.rope_spec({"model_type": "llama", "rope_theta": 10000.0, **d})
    assert spec.head_dim == 288


@pytest.mark.parametrize("model_type", ["phi", "stablelm"])
def test_an_explicit_null_rotary_fraction_rotates_the_whole_head(model_type):
    d = {"hidden_size": 2560, "num_attention_heads": 32, "rope_theta": 10000.0}
    null = hf.rope_spec({"model_type": model_type, **d, "partial_rotary_factor": None})
    absent = hf.rope_spec({"model_type": model_type, **d})
    cfg = _quiet_config(model_type, {**d, "partial_rotary_factor": None})
    theirs = cfg.rope_parameters.get("partial_rotary_factor", 1.0)
    assert null.rotary_dim == int(80 * theirs) == 80
    assert absent.rotary_dim < 80 and any("is null" in n for n in null.notes)


def test_a_bad_key_rope_does_not_read_is_not_a_crash(tmp_path, capsys):
    import json

    d = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32}
    d["torch_dtype"] = 1e308  # CodeLlama's file, mutated; no rope_theta: read from the class
    path = tmp_path / "config.json"
    path.write_text(json.dumps(d))
    assert hf.rope_spec(d).base == 10000.0
    assert cli.main(["inspect", str(path)]) == 0


def test_a_composite_class_s_head_dim_default_is_read_through_it():
    # Voxtral's text config (model_type llama) without head_dim: VoxtralConfig gives it 128,
    # where hidden_size / num_attention_heads = 96 (found by the differential fuzz).
    import json
    import pathlib

    data = pathlib.Path(__file__).parent / "data" / "hf_configs"
    d = json.loads((data / "voxtral__voxtral-mini-3b-2507.json").read_text())
    d["text_config"].pop("head_dim", None)
    assert hf.rope_spec(d).head_dim == 128


# --- crashes that were input errors (issue 30, item 10) ----------------------------------------

_BIG = 1 << 62
_META_Q = torch.zeros(1, 1, 2, 8, device="meta")


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: posemb.RotaryEmbedding(8)(_META_Q, _META_Q), "q is on the meta device"),
        (
            lambda: posemb.RotaryEmbedding(8)(
                torch.zeros(1, 1, 2, 8), torch.zeros(1, 1, 2, 8), torch.arange(2, device="meta")
            ),
            "positions are on the meta device",
        ),
        (lambda: kernels.rotate(_META_Q, _META_Q, None, None), "q is on the meta device"),
        (
            lambda: posemb.AlibiBias(2)(torch.arange(2, device="meta"), torch.arange(2)),
            "q_positions are on the meta device",
        ),
        (lambda: posemb.scaling.NTK(1e308).compute(8, 1e4), r"NTK scaling by 1e\+308"),
        (
            lambda: posemb.scaling.DynamicNTK(1e308, 4).compute(8, 1e4, 100),
            r"DynamicNTK\(factor=1e\+308\)",
        ),
        (
            lambda: posemb.RotaryEmbedding(8, scaling=posemb.scaling.DynamicNTK(1e17, 4))(
                torch.zeros(1, 1, 2, 8), torch.zeros(1, 1, 2, 8)
            ),
            "must be finite and about 1 or more: choose a smaller factor",
        ),
        (
            lambda: posemb.AlibiBias(2)(torch.zeros(2, 4, dtype=int), torch.zeros(3, 4, dtype=int)),
            "must have one batch",
        ),
        (
            lambda: posemb.AlibiBias(2)(torch.tensor([_BIG]), torch.tensor([5 - _BIG])),
            r"q_positions must lie within -2\^53 .. 2\^53",
        ),
        (
            lambda: posemb.T5Bias(2)(torch.tensor([_BIG]), torch.tensor([5 - _BIG])),
            r"q_positions must lie within",
        ),
        (
            lambda: posemb.t5_relative_bucket(torch.tensor([-(1 << 63)])),
            "relative_position must lie within",
        ),
        (
            lambda: posemb.RotaryEmbedding(8)(
                torch.zeros(1, 1, 2, 8), torch.zeros(1, 1, 2, 8), torch.tensor([0, 1 << 60])
            ),
            "positions must lie within",
        ),
    ],
    ids=[
        "meta-q", "meta-positions", "meta-kernel", "meta-bias", "ntk-overflow",
        "dynamic-overflow", "dynamic-cancels", "alibi-batches", "alibi-2^62", "t5-2^62",
        "t5-int64-min", "rope-2^60",
    ],
)  # fmt: skip
def test_what_crashed_is_refused_in_one_clear_error(call, match):
    # Each raised NotImplementedError, RuntimeError, OverflowError or IndexError, blamed the
    # base, or (ALiBi near 2^62) gave +5.8e17 for a distance of 5.
    with pytest.raises(posemb.InputError, match=match):
        call()


def test_positions_at_the_limit_still_work():
    limit = 1 << 53
    bias = posemb.AlibiBias(1)(torch.tensor([limit]), torch.tensor([limit - 3]))
    assert float(bias) == -3.0 * float(posemb.alibi_slopes(1))
    q = torch.randn(1, 1, 2, 8)
    rope = posemb.RotaryEmbedding(8)
    far, _ = rope(q, q, torch.tensor([limit - 1, limit]))
    assert torch.isfinite(far).all()
