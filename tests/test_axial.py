"""Axial RoPE: relative along each axis, presets equal to the transformers vision modules."""

import pytest
import torch

import posemb
from devices import device_of
from posemb.axial import AxialRotaryEmbedding
from tolerances import assert_close

F64 = torch.float64


def _grid(h, w):
    # cpu: patch positions; the module's tables are formed where its q and k are
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


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("order", ["blocks", "alternate", "chunks"])
@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_fused_per_token_tables_match_the_reference_forward_and_backward(backend, order, layout):
    if backend == "cpu" and posemb.kernels.status()["cpu"] != "available":
        pytest.skip(posemb.kernels.status()["cpu"])
    pos = _grid(5, 4).reshape(-1, 2)
    device = device_of(backend)  # the reference and the CPU op: "cpu" on every host
    q = torch.randn(2, 4, 20, 32, device=device, requires_grad=True)
    k = torch.randn(2, 2, 20, 32, device=device, requires_grad=True)
    fused = AxialRotaryEmbedding(32, backend=backend, order=order, layout=layout)
    plain = AxialRotaryEmbedding(32, backend="reference", order=order, layout=layout)
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
    with pytest.raises(ValueError, match="frequencies must be one of"):
        AxialRotaryEmbedding(32, frequencies="spiral")
    with pytest.raises(ValueError, match="order must be one of"):
        AxialRotaryEmbedding(32, order="rows")
    with pytest.raises(ValueError, match="heads"):
        AxialRotaryEmbedding(32, frequencies="mixed")
    with pytest.raises(ValueError, match="cannot learn frequencies"):
        AxialRotaryEmbedding(32, frequencies="mixed", heads=2, backend="cpu")
    with pytest.raises(ValueError, match="cls must be"):
        AxialRotaryEmbedding(32).grid(2, 2, cls="middle")
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


def test_mixed_frequencies_keep_the_logit_relative_to_the_offset_vector():
    torch.manual_seed(0)
    rope = AxialRotaryEmbedding(32, frequencies="mixed", heads=2, base=10.0).double()
    q, k = torch.randn(1, 2, 1, 32, dtype=F64), torch.randn(1, 2, 1, 32, dtype=F64)

    def logits(pq, pk):
        a, _ = rope(q, k, torch.tensor([pq], dtype=F64))
        _, b = rope(q, k, torch.tensor([pk], dtype=F64))
        return (a * b).sum(-1)

    base = logits((3.0, 5.0), (1.0, 2.0))
    torch.testing.assert_close(logits((10.5, 12.25), (8.5, 9.25)), base, rtol=0, atol=1e-12)
    assert (logits((3.0, 6.0), (1.0, 2.0)) - base).abs().min() > 1e-6  # another offset


def test_mixed_frequencies_set_to_the_axes_are_axial_rope_and_they_learn():
    axial = AxialRotaryEmbedding(16)
    mixed = AxialRotaryEmbedding(16, frequencies="mixed", heads=2)
    axis, freq = axial.pair_axes()
    with torch.no_grad():
        mixed.mixed.zero_()
        mixed.mixed[:, torch.arange(8), axis] = freq.float()
    pos = _grid(3, 4).reshape(-1, 2)
    q, k = torch.randn(1, 2, 12, 16), torch.randn(1, 2, 12, 16)
    for a, b in zip(mixed(q, k, pos), axial(q, k, pos), strict=True):
        assert_close(a, b, torch.float32)
    q.requires_grad_()
    out, _ = mixed(q, k, pos)
    out.square().sum().backward()
    assert mixed.mixed.grad is not None and mixed.mixed.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="made for 2 key heads"):
        mixed(q, torch.randn(1, 3, 12, 16), pos)


def test_mixed_init_is_the_papers_rotated_pairs_of_magnitudes():
    torch.manual_seed(1)
    f = posemb.axial.mixed_init(32, heads=3, axes=2, base=10.0)
    mag = 10.0 ** (-4.0 * torch.arange(8, dtype=F64) / 32)
    torch.testing.assert_close(f.norm(dim=-1), torch.cat((mag, mag)).expand(3, 16))
    # Pair i and pair i + head_dim / 4 point at right angles; heads point differently.
    torch.testing.assert_close(
        (f[:, :8] * f[:, 8:]).sum(-1), torch.zeros(3, 8, dtype=F64), atol=1e-15, rtol=0
    )
    assert not torch.allclose(f[0], f[1])
    with pytest.raises(ValueError, match="divisible by 4"):
        posemb.axial.mixed_init(18, heads=1, axes=2, base=10.0)


def test_patch_positions_orders_and_class_tokens():
    g = posemb.axial.patch_positions(2, 3)
    assert g.tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]
    xy = posemb.axial.patch_positions(2, 3, coordinates=("x", "y"), start=1, cls="first")
    assert torch.isnan(xy[0]).all() and xy[1:].tolist() == [
        [1, 1], [2, 1], [3, 1], [1, 2], [2, 2], [3, 2]
    ]  # fmt: skip


def test_mixed_frequencies_with_gqa_batched_positions_and_unrotated_tokens():
    torch.manual_seed(3)
    rope = AxialRotaryEmbedding(16, frequencies="mixed", heads=2).double()
    q, k = torch.randn(2, 6, 5, 16, dtype=F64), torch.randn(2, 2, 5, 16, dtype=F64)
    pos = torch.rand(2, 5, 2, dtype=F64) * 4
    pos[1, 0] = float("nan")  # the second sequence's first token is a class token
    oq, ok = rope(q, k, pos)
    torch.testing.assert_close(oq[1, :, 0], q[1, :, 0], rtol=0, atol=0)
    for b in range(2):  # each sequence as if alone; query head j uses key head j // 3
        one_q, one_k = rope(q[b : b + 1], k[b : b + 1], pos[b])
        torch.testing.assert_close(oq[b : b + 1], one_q, rtol=0, atol=1e-15)
        torch.testing.assert_close(ok[b : b + 1], one_k, rtol=0, atol=1e-15)
        for j in range(6):
            alone, _ = rope(q[b : b + 1, j : j + 1].expand(1, 2, 5, 16), k[b : b + 1], pos[b])
            torch.testing.assert_close(oq[b, j], alone[0, j // 3], rtol=0, atol=1e-15)
    half = AxialRotaryEmbedding(16, frequencies="mixed", heads=2).to(torch.bfloat16)
    with torch.no_grad():
        half.mixed.copy_(rope.mixed)  # bfloat16 frequencies, yet float64 angles from them
    angle = half.cos_sin(pos, F64)[0]
    exact = AxialRotaryEmbedding(16, frequencies="mixed", heads=2).double()
    with torch.no_grad():
        exact.mixed.copy_(half.mixed.double())
    torch.testing.assert_close(angle, exact.cos_sin(pos, F64)[0], rtol=0, atol=1e-12)


def test_chunks_with_batched_positions_rotate_each_sequence_by_its_own():
    rope = AxialRotaryEmbedding(24, order="chunks", split=(4, 8))
    q, k = torch.randn(2, 2, 6, 24), torch.randn(2, 1, 6, 24)
    pos = torch.stack((_grid(2, 3).reshape(-1, 2), _grid(3, 2).reshape(-1, 2))).float()
    oq, ok = rope(q, k, pos)
    for b in range(2):
        one_q, one_k = rope(q[b : b + 1], k[b : b + 1], pos[b])
        assert_close(oq[b : b + 1], one_q, torch.float32)
        assert_close(ok[b : b + 1], one_k, torch.float32)
    # Channels 0-7 are the first axis's slice: rotate-half within it, untouched by the second.
    only_rows = pos.clone()
    only_rows[..., 1] = 0
    a, _ = rope(q, k, only_rows)
    torch.testing.assert_close(a[..., 8:], q[..., 8:], rtol=0, atol=0)


def test_settings_that_do_not_apply_or_do_not_fit_are_refused():
    with pytest.raises(ValueError, match="split and order do not apply"):
        AxialRotaryEmbedding(32, frequencies="mixed", heads=2, split=(8, 8))
    with pytest.raises(ValueError, match="heads=2 with frequencies 'per_axis'"):
        AxialRotaryEmbedding(32, heads=2)
    with pytest.raises(ValueError, match="coordinates must name each of the 2 axes"):
        AxialRotaryEmbedding(32, coordinates=("a", "b", "c"))
    with pytest.raises(ValueError, match="start must be an integer"):
        AxialRotaryEmbedding(32, start=1.7)
    with pytest.raises(ValueError, match="axes must be 2 or 3"):
        posemb.axial.mixed_init(32, heads=1, axes=1, base=10.0)
    # Three axes with mixed frequencies need no equal split of pairs.
    assert AxialRotaryEmbedding(64, axes=3, frequencies="mixed", heads=2).mixed.shape == (2, 32, 3)
