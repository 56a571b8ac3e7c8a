"""Axial RoPE: relative along each axis, presets equal to the transformers vision modules."""

import pytest
import torch

import posemb
from posemb.axial import AxialRotaryEmbedding
from tolerances import assert_close

F64 = torch.float64


def _grid(h, w):
    return torch.stack(torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij"), -1)


def test_the_logit_depends_on_the_offset_along_each_axis():
    rope = AxialRotaryEmbedding(32)
    g = torch.Generator().manual_seed(0)
    q, k = (
        torch.randn(1, 1, 1, 32, generator=g, dtype=F64),
        torch.randn(1, 1, 1, 32, generator=g, dtype=F64),
    )

    def logit(pq, pk):
        a, _ = rope(q, q[:, :0], torch.tensor([pq]))
        b, _ = rope(k, k[:, :0], torch.tensor([pk]))
        return float((a * b).sum())

    base = logit((3, 5), (1, 2))
    assert logit((13, 5), (11, 2)) == pytest.approx(base, abs=1e-12)  # shifted in h
    assert logit((3, 25), (1, 22)) == pytest.approx(base, abs=1e-12)  # shifted in w
    assert abs(logit((3, 5), (1, 3)) - base) > 1e-3  # another offset in w


def test_nan_coordinates_leave_a_token_unrotated_and_floats_are_allowed():
    rope = AxialRotaryEmbedding(24, axes=3)  # time, height, width: 4 pairs each
    x = torch.randn(1, 2, 3, 24, dtype=F64)
    pos = torch.tensor([[float("nan")] * 3, [0.25, 0.5, 0.75], [1.0, 2.0, 3.0]], dtype=F64)
    out, _ = rope(x, x[:, :0], pos)
    torch.testing.assert_close(out[:, :, 0], x[:, :, 0], rtol=0, atol=0)
    assert not torch.allclose(out[:, :, 1], x[:, :, 1])
    # Norms are kept: it is a rotation.
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("head_dim", [64, 80])
def test_the_qwen2_vl_preset_is_its_vision_rotary(head_dim):
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen2_vl import modeling_qwen2_vl as m

    heads = 4
    config = transformers.Qwen2VLConfig().vision_config
    config.embed_dim, config.num_heads = head_dim * heads, heads
    theirs = m.Qwen2VLVisionRotaryEmbedding(config)
    torch.manual_seed(head_dim)
    pos = _grid(6, 7).reshape(-1, 2)
    q = torch.randn(pos.shape[0], heads, head_dim)
    k = torch.randn(pos.shape[0], heads, head_dim)
    cos, sin = theirs(q, pos)
    tq, tk = m.apply_rotary_pos_emb_vision(q, k, cos, sin)
    ours = AxialRotaryEmbedding.preset(
        "qwen2_vl", head_dim, base=config.rope_parameters["rope_theta"]
    )
    oq, ok = ours(q.transpose(0, 1)[None], k.transpose(0, 1)[None], pos)
    worst = max(
        float((oq[0].transpose(0, 1) - tq).abs().max()),
        float((ok[0].transpose(0, 1) - tk).abs().max()),
    )
    # transformers forms its angles in float32: each is off by up to half an ulp of the angle
    # (the largest here is 6 rad), which moves a channel by that much times its size.
    angle_ulp = torch.finfo(torch.float32).eps * 6.0
    bound = 2 * angle_ulp * float(torch.cat((q, k)).abs().max()) + 1e-6
    assert worst < bound, (worst, bound)
    print(f"qwen2_vl head_dim {head_dim}: worst difference {worst:.2e}")


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_fused_per_token_tables_match_the_reference_forward_and_backward(backend):
    if backend == "cpu" and posemb.kernels.status()["cpu"] != "available":
        pytest.skip(posemb.kernels.status()["cpu"])
    pos = _grid(5, 4).reshape(-1, 2)
    q = torch.randn(2, 4, 20, 32, requires_grad=True)
    k = torch.randn(2, 2, 20, 32, requires_grad=True)
    fused = AxialRotaryEmbedding(32, backend=backend)
    plain = AxialRotaryEmbedding(32, backend="reference")
    a = fused(q, k, pos)
    b = plain(q.detach().double(), k.detach().double(), pos)
    assert_close(a[0], b[0], torch.float32)
    assert_close(a[1], b[1], torch.float32)
    (a[0].sum() + a[1].square().sum()).backward()
    qq, kk = q.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    c = plain(qq, kk, pos)
    (c[0].sum() + c[1].square().sum()).backward()
    assert_close(q.grad, qq.grad, torch.float32)
    assert_close(k.grad, kk.grad, torch.float32)


def test_bad_axial_settings_are_refused():
    with pytest.raises(ValueError, match="axes must be 2 or 3"):
        AxialRotaryEmbedding(32, axes=4)
    with pytest.raises(ValueError, match="do not split equally over 3 axes"):
        AxialRotaryEmbedding(32, axes=3)
    with pytest.raises(ValueError, match="split must give each"):
        AxialRotaryEmbedding(32, split=(10, 5))
    with pytest.raises(ValueError, match="unknown axial preset 'sam3'"):
        AxialRotaryEmbedding.preset("sam3", 64)
    with pytest.raises(ValueError, match="frequencies must be"):
        AxialRotaryEmbedding(32, frequencies="mixed")
    rope = AxialRotaryEmbedding(16)
    x = torch.randn(1, 1, 3, 16)
    with pytest.raises(ValueError, match="positions must have shape"):
        rope(x, x, torch.zeros(4, 2))
    with pytest.raises(ValueError, match="positions must have shape"):
        rope(torch.randn(2, 1, 3, 16), torch.randn(2, 1, 3, 16), torch.zeros(3, 3, 2))
    with pytest.raises(ValueError, match="positions must be a tensor"):
        rope(x, x, "a")
    with pytest.raises(ValueError, match="must be finite"):
        rope(x, x, torch.tensor([[0.0, float("inf")]] * 3))


@pytest.mark.parametrize("head_dim", [64, 88])
def test_the_pixtral_preset_is_its_vision_rotary(head_dim):
    transformers = pytest.importorskip("transformers")
    from transformers.models.pixtral import modeling_pixtral as m

    heads = 2
    config = transformers.PixtralVisionConfig(
        hidden_size=head_dim * heads, num_attention_heads=heads, head_dim=head_dim
    )
    theirs = m.PixtralVisionRotaryEmbedding(config)
    torch.manual_seed(head_dim)
    pos = _grid(5, 8).reshape(-1, 2)
    q = torch.randn(1, heads, pos.shape[0], head_dim)
    k = torch.randn(1, heads, pos.shape[0], head_dim)
    cos, sin = theirs(q, pos)
    tq, tk = m.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=0)
    ours = AxialRotaryEmbedding.preset(
        "pixtral", head_dim, base=config.rope_parameters["rope_theta"]
    )
    oq, ok = ours(q, k, pos)
    worst = max(float((oq - tq).abs().max()), float((ok - tk).abs().max()))
    angle_ulp = torch.finfo(torch.float32).eps * 8.0  # the largest angle here is 7 rad
    assert worst < 2 * angle_ulp * float(torch.cat((q, k)).abs().max()) + 1e-6, worst
    print(f"pixtral head_dim {head_dim}: worst difference {worst:.2e}")
