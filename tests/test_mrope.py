"""M-RoPE (Qwen2-VL / Qwen2.5-VL / Qwen3-VL / Qwen3.5) and the vision tower's 2D RoPE, against
transformers and through the fused kernels.

Tolerances. posemb forms tables in float64 and rounds once, so against an exact float64
reference its float32 tables are within ``TOL[float32]`` (tests/tolerances.py). transformers
forms ``position.float() * inv_freq`` in float32: its ``inv_freq`` (pow and a division in
float32) carries a relative error of up to ~2 roundoffs u = 2^-24 and the product one more, so
the angle p * theta (theta <= 1) moves by at most 3 p u; float32 cos/sin and the final rounding
add a few u. Hence ``|cos_hf - cos_exact| <= (3 P + 4) u`` at largest position P, and rotated q/k
(a' = a cos - b sin) move by at most ``max(|a| + |b|)`` times that. Positions here reach P ~ 2000,
a bound of ~3.6e-4 (measured: 4e-5); a wrong axis or section moves angles by whole radians, far
outside it (``test_a_wrong_assignment_breaks_the_match``).
"""

import pytest
import torch

import posemb
from devices import device_of
from posemb import kernels, mrope
from posemb.kernels import reference
from tolerances import TOL, UNIT_ROUNDOFF, assert_close

F64 = torch.float64
U32 = UNIT_ROUNDOFF[torch.float32]


def hf_drift(max_position: int) -> float:
    """Bound on transformers' float32 table error at positions <= max_position (module doc)."""
    return (3 * max_position + 4) * U32


# --- which pair follows which axis ----------------------------------------------------------


def test_axes_chunked_and_interleaved_by_hand():
    assert mrope.mrope_axes([1, 2, 1]).tolist() == [0, 1, 1, 2]
    assert mrope.mrope_axes([2, 1, 1], interleaved=True).tolist() == [0, 1, 2, 0]
    # Qwen3-VL's (24, 20, 20): height at 1, 4, ..., 58; width at 2, 5, ..., 59; the rest temporal.
    axes = mrope.mrope_axes([24, 20, 20], interleaved=True)
    assert axes[1:60:3].eq(1).all() and axes[2:60:3].eq(2).all()
    assert axes[0:60:3].eq(0).all() and axes[60:].eq(0).all()
    assert torch.bincount(axes).tolist() == [24, 20, 20]


def test_describe_axes():
    assert (
        mrope.describe_mrope_axes([16, 24, 24]) == "pairs 0-15 temporal, 16-39 height, 40-63 width"
    )
    assert mrope.describe_mrope_axes([24, 20, 20], interleaved=True) == (
        "pairs 0-60 cycle temporal, height, width (pair j follows axis j mod 3), 61-63 temporal"
    )
    assert mrope.describe_mrope_axes([11, 11, 10], interleaved=True) == (
        "pairs 0-31 cycle temporal, height, width (pair j follows axis j mod 3)"
    )
    assert mrope.describe_mrope_axes([1, 0, 2]) == "pairs 0 temporal, 1-2 width"


@pytest.mark.parametrize(
    "section,interleaved,match",
    [
        ([16, 24], False, "mrope_section must be three non-negative integers"),
        ([16, -1, 24], False, "mrope_section must be three non-negative integers"),
        ([True, 1, 1], False, "mrope_section must be three non-negative integers"),
        ((0, 0, 0), False, "positive sum"),
        ([0, 8, 0], True, r"cannot be interleaved over 8 pairs.*3\*height <= 9"),
        ([4, 0, 4], True, r"3\*width <= 8"),
    ],
)
def test_bad_sections_are_refused(section, interleaved, match):
    with pytest.raises(ValueError, match=match):
        mrope.mrope_axes(section, interleaved)


def test_section_must_cover_the_rotary_pairs():
    inv = posemb.inv_freq(32, dtype=F64)
    with pytest.raises(ValueError, match=r"covers 15 pairs.*rotary_dim/2"):
        mrope.mrope_cos_sin(torch.zeros(3, 1, 2, dtype=torch.long), inv, [5, 5, 5])
    with pytest.raises(ValueError, match=r"covers 16 pairs; allowed .* rotary_dim/2 = 8"):
        mrope.MRotaryEmbedding(32, mrope_section=[4, 6, 6], rotary_dim=16, backend="reference")
    with pytest.raises(ValueError, match=r"pass positions\[1:\]"):
        mrope.mrope_cos_sin(torch.zeros(4, 1, 2, dtype=torch.long), inv, [4, 6, 6])


# --- tables and rotation against transformers -----------------------------------------------

# (family, head_dim, partial_rotary_factor, section, interleaved): the rotary module and
# apply function of each family; Qwen3.5 rotates a quarter of its head in the real model.
FAMILIES = [
    ("qwen2_vl", 32, 1.0, [4, 6, 6], False),
    ("qwen2_5_vl", 32, 1.0, [4, 6, 6], False),
    ("qwen3_vl", 32, 1.0, [6, 5, 5], True),
    ("qwen3_5", 32, 0.5, [3, 3, 2], True),
]


# family -> (text config class, text rotary class) in transformers.models.<family>.
HF_CLASSES = {
    "qwen2_vl": ("Qwen2VLTextConfig", "Qwen2VLRotaryEmbedding"),
    "qwen2_5_vl": ("Qwen2_5_VLTextConfig", "Qwen2_5_VLRotaryEmbedding"),
    "qwen3_vl": ("Qwen3VLTextConfig", "Qwen3VLTextRotaryEmbedding"),
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5TextRotaryEmbedding"),
}


def hf_rotary(family, head_dim, partial, section, base, rope_type="default", **extra):
    """transformers' text rotary module of ``family`` and the family's q/k apply function."""
    pytest.importorskip("transformers")
    import importlib

    mod = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    cfg_mod = importlib.import_module(f"transformers.models.{family}.configuration_{family}")
    config_name, rotary_name = HF_CLASSES[family]
    params = {"rope_type": rope_type, "rope_theta": base, "mrope_section": section, **extra}
    if family == "qwen3_5":
        params["partial_rotary_factor"] = partial
    config = getattr(cfg_mod, config_name)(
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=head_dim,
        rope_parameters=params,
    )
    return getattr(mod, rotary_name)(config), mod.apply_rotary_pos_emb


def random_positions(batch, seq, high, seed=0):
    return torch.randint(0, high, (3, batch, seq), generator=torch.Generator().manual_seed(seed))


def exact_tables(positions, rotary_dim, base, axes):
    """float64 reference written from the definition: pair i turns by p[axis_i] * theta_i."""
    theta = base ** (-torch.arange(0, rotary_dim, 2, dtype=F64) / rotary_dim)
    p = torch.stack([positions[a] for a in axes.tolist()], dim=-1).to(F64)  # (B, S, n)
    return torch.cos(p * theta), torch.sin(p * theta)


@pytest.mark.parametrize("family,head_dim,partial,section,interleaved", FAMILIES)
def test_tables_and_rotation_match_transformers(family, head_dim, partial, section, interleaved):
    base = 1e6
    hf_module, apply = hf_rotary(family, head_dim, partial, section, base)
    rotary_dim = int(head_dim * partial)
    n = rotary_dim // 2
    pos = random_positions(2, 37, 2000)
    top = int(pos.max())

    # posemb against the definition, in float32: one rounding.
    emb = mrope.MRotaryEmbedding(
        head_dim, base, section, interleaved, rotary_dim=rotary_dim, backend="reference"
    )
    cos, sin = emb.cos_sin(pos)
    want_c, want_s = exact_tables(pos, rotary_dim, base, mrope.mrope_axes(section, interleaved))
    assert_close(cos, want_c, torch.float32)
    assert_close(sin, want_s, torch.float32)

    # transformers: cat((f, f)) of width rotary_dim, formed in float32.
    hf_cos, hf_sin = hf_module(torch.zeros(1), pos)
    assert hf_cos.shape == (2, 37, rotary_dim)
    assert torch.equal(hf_cos[..., :n], hf_cos[..., n:])
    drift = hf_drift(top)
    torch.testing.assert_close(hf_cos[..., :n], cos, rtol=0, atol=drift)
    torch.testing.assert_close(hf_sin[..., :n], sin, rtol=0, atol=drift)

    # q and k after rotation: GQA (4 query heads, 1 key head), odd length.
    g = torch.Generator().manual_seed(1)
    q, k = (
        torch.randn(2, 4, 37, head_dim, generator=g),
        torch.randn(2, 1, 37, head_dim, generator=g),
    )
    hf_q, hf_k = apply(q, k, hf_cos, hf_sin)
    for backend in ("reference", "cpu"):
        emb.backend = backend
        got_q, got_k = emb(q, k, pos)
        for got, hf, x in ((got_q, hf_q, q), (got_k, hf_k, k)):
            a, b = x[..., :n].abs(), x[..., n:rotary_dim].abs()
            bound = float((a + b).max()) * drift + TOL[torch.float32]["atol"]
            torch.testing.assert_close(got, hf, rtol=0, atol=bound)
            assert torch.equal(got[..., rotary_dim:], x[..., rotary_dim:])


def test_attention_factor_of_a_scaling_matches_transformers():
    """YaRN's attention factor multiplies the M-RoPE tables as it does 1D tables."""
    section, head_dim, base = [4, 6, 6], 32, 1e6
    yarn = {"factor": 4.0, "original_max_position_embeddings": 512}
    hf_module, _ = hf_rotary("qwen2_vl", head_dim, 1.0, section, base, "yarn", **yarn)
    assert hf_module.attention_scaling != 1.0
    scaling = posemb.scaling.Yarn(4.0, 512)
    emb = mrope.MRotaryEmbedding(head_dim, base, section, scaling=scaling, backend="reference")
    pos = random_positions(1, 20, 1500, seed=3)
    cos, sin = emb.cos_sin(pos)
    hf_cos, hf_sin = hf_module(torch.zeros(1), pos)
    torch.testing.assert_close(hf_cos[..., :16], cos, rtol=0, atol=hf_drift(int(pos.max())))
    torch.testing.assert_close(hf_sin[..., :16], sin, rtol=0, atol=hf_drift(int(pos.max())))


@pytest.mark.parametrize(
    "positions_shape", [(2, 11), (11,), (1, 2, 11)], ids=["batch_seq", "seq", "one_axis"]
)
def test_text_positions_broadcast_to_the_three_axes_as_in_transformers(positions_shape):
    """(B, S) and (1, B, S) are text positions on every axis (transformers expands them);
    posemb also takes (S,), which transformers' expand(3, -1, -1) refuses."""
    hf_module, _ = hf_rotary("qwen3_vl", 32, 1.0, [6, 5, 5], 1e6)
    pos = torch.arange(100, 122).reshape(2, 11)
    text = pos[0] if positions_shape == (11,) else pos.reshape(positions_shape)
    emb = mrope.MRotaryEmbedding(32, 1e6, [6, 5, 5], interleaved=True, backend="reference")
    cos, _ = emb.cos_sin(text)
    want, _ = hf_module(torch.zeros(1), pos[:1] if positions_shape == (11,) else text)
    torch.testing.assert_close(want[..., :16], cos, rtol=0, atol=hf_drift(121))


@pytest.mark.parametrize("interleaved", [False, True])
def test_on_text_mrope_is_1d_rope(interleaved):
    """Text has the same id on every axis, so any assignment rotates as plain RoPE."""
    g = torch.Generator().manual_seed(4)
    q, k = torch.randn(2, 3, 9, 48, generator=g), torch.randn(2, 1, 9, 48, generator=g)
    pos = torch.randint(0, 5000, (2, 9), generator=g)
    section = [8, 8, 8] if not interleaved else [10, 7, 7]
    mm = mrope.MRotaryEmbedding(48, 5e5, section, interleaved, backend="reference")
    plain = posemb.RotaryEmbedding(48, 5e5, backend="reference")
    for got, want in zip(mm(q, k, pos), plain(q, k, pos), strict=True):
        assert_close(got, want, torch.float32)


def test_a_wrong_assignment_breaks_the_match():
    """The comparison can fail: swapped sections, the other assignment, or the rows of the
    positions swapped all leave transformers' tables far outside the tolerance."""
    pos = random_positions(2, 37, 2000, seed=5)
    drift = hf_drift(int(pos.max()))
    inv = posemb.inv_freq(32, 1e6, dtype=F64)
    chunked, _ = hf_rotary("qwen2_vl", 32, 1.0, [4, 6, 6], 1e6)
    interleaved, _ = hf_rotary("qwen3_vl", 32, 1.0, [6, 5, 5], 1e6)
    hf_chunked = chunked(torch.zeros(1), pos)[0][..., :16]
    hf_interleaved = interleaved(torch.zeros(1), pos)[0][..., :16]
    wrong = [
        (hf_chunked, mrope.mrope_cos_sin(pos, inv, [6, 4, 6])[0]),  # sections swapped
        (hf_chunked, mrope.mrope_cos_sin(pos[[1, 0, 2]], inv, [4, 6, 6])[0]),  # height as time
        (hf_interleaved, mrope.mrope_cos_sin(pos, inv, [6, 5, 5])[0]),  # chunked for Qwen3-VL
    ]
    for hf_cos, cos in wrong:
        assert float((hf_cos - cos).abs().max()) > 100 * drift
    right = [
        (hf_chunked, mrope.mrope_cos_sin(pos, inv, [4, 6, 6])[0]),
        (hf_interleaved, mrope.mrope_cos_sin(pos, inv, [6, 5, 5], interleaved=True)[0]),
    ]
    for hf_cos, cos in right:
        assert float((hf_cos - cos).abs().max()) <= drift


# --- 3D position ids ----------------------------------------------------------------------

IMG, VID, START, END = 151, 152, 150, 153


@pytest.fixture(scope="module")
def hf_models():
    """Tiny randomly initialised Qwen2-VL, Qwen2.5-VL and Qwen3-VL models: their
    ``get_rope_index`` is a method that reads the merge size (and tokens per second) from the
    config."""
    pytest.importorskip("transformers")
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLModel,
        Qwen2VLConfig,
        Qwen2VLModel,
        Qwen3VLConfig,
        Qwen3VLModel,
    )

    text = {
        "hidden_size": 32,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "num_hidden_layers": 1,
        "intermediate_size": 32,
        "vocab_size": 160,
        "bos_token_id": None,
        "eos_token_id": None,
    }
    vision = {"depth": 1, "hidden_size": 32, "num_heads": 2, "spatial_merge_size": 2}
    ids = {"image_token_id": IMG, "video_token_id": VID, "vision_start_token_id": START}
    models = {}
    for name, cfg_cls, model_cls, vis in (
        ("qwen2_vl", Qwen2VLConfig, Qwen2VLModel, {"embed_dim": 32, "mlp_ratio": 1}),
        (
            "qwen2_5_vl",
            Qwen2_5_VLConfig,
            Qwen2_5_VLModel,
            {"intermediate_size": 32, "out_hidden_size": 32},
        ),
        ("qwen3_vl", Qwen3VLConfig, Qwen3VLModel, {"intermediate_size": 32, "out_hidden_size": 32}),
    ):
        config = cfg_cls(text_config=dict(text), vision_config={**vision, **vis}, **ids)
        models[name] = model_cls(config).eval()
    return models


def image(t, h, w, merge=2):
    """Placeholder tokens of one image or video frame group, framed as a chat template does."""
    return [START] + [IMG] * (t * h * w // merge**2) + [END]


def video(t, h, w, merge=2):
    return [START] + [VID] * (t * h * w // merge**2) + [END]


def hf_rope_index(model, ids, mask=None, **grids):
    types = (ids == IMG).int() + 2 * (ids == VID).int()
    return model.get_rope_index(ids, types, attention_mask=mask, **grids)


def ours(ids, mask=None, **kw):
    return mrope.mrope_position_ids(
        ids,
        image_token_id=IMG,
        video_token_id=VID,
        vision_start_token_id=START,
        attention_mask=mask,
        **kw,
    )


# (name, token list, image grids, video grids): text only, one image, two images between text,
# a short video (its temporal ids stay below max(h, w)/merge, where both numbering rules agree).
CASES = [
    ("text", [1, 2, 3, 4, 5], None, None),
    ("image", [1, 2, *image(1, 4, 6), 3, 4], [[1, 4, 6]], None),
    ("two_images", [1, *image(1, 2, 4), 5, 6, *image(1, 6, 4), 7], [[1, 2, 4], [1, 6, 4]], None),
    ("video", [1, 2, *video(2, 6, 4), 3], None, [[2, 6, 4]]),
    ("image_and_video", [*image(1, 4, 4), 9, *video(2, 4, 8), 8], [[1, 4, 4]], [[2, 4, 8]]),
]


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_position_ids_match_transformers(hf_models, family, case):
    _, tokens, images, videos = case
    ids = torch.tensor([tokens])
    kw = {}
    if images:
        kw["image_grid_thw"] = torch.tensor(images)
    if videos:
        kw["video_grid_thw"] = torch.tensor(videos)
    extra = {}
    if family == "qwen2_5_vl" and videos:
        # 0.375 s per grid * 4 ids per second: temporal step 1.5, floored to 0, 1, ...
        kw["second_per_grid_ts"] = torch.tensor([0.375] * len(videos))
        extra["tokens_per_second"] = hf_models[family].config.vision_config.tokens_per_second
        assert extra["tokens_per_second"] == 4
    want_pos, want_delta = hf_rope_index(hf_models[family], ids, **kw)
    got_pos, got_delta = ours(ids, **kw, **extra)
    assert torch.equal(got_pos, want_pos)
    assert torch.equal(got_delta, want_delta)


def test_position_ids_with_left_padding_match_transformers(hf_models):
    rows = [[1, *image(1, 4, 4), 2, 3, 4], [5, 6, 7, *image(1, 2, 2), *image(1, 2, 4), 8]]
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    grids = {"image_grid_thw": torch.tensor([[1, 4, 4], [1, 2, 2], [1, 2, 4]])}
    want_pos, want_delta = hf_rope_index(hf_models["qwen2_vl"], ids, mask, **grids)
    got_pos, got_delta = ours(ids, mask, **grids)
    assert torch.equal(got_pos, want_pos)  # padding: 0 on every axis, as transformers 5
    assert torch.equal(got_delta, want_delta)


def test_qwen3_vl_frames_apart_match_transformers(hf_models):
    """Qwen3-VL separates a video's frames by timestamp text: each frame is an item, t = 1."""
    frames = [tok for i in range(3) for tok in [40 + i, *video(1, 4, 4)]]
    ids = torch.tensor([[1, 2, *frames, 3]])
    grids = {"video_grid_thw": torch.tensor([[3, 4, 4]])}
    want_pos, want_delta = hf_rope_index(hf_models["qwen3_vl"], ids, **grids)
    got_pos, got_delta = ours(ids, frames_apart=True, **grids)
    assert torch.equal(got_pos, want_pos)
    assert torch.equal(got_delta, want_delta)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
def test_after_a_long_video_transformers_5_resumes_inside_the_video(hf_models, family):
    """A video whose temporal ids outrun its grid: the paper (and transformers 4.x) resume at
    max + 1; transformers 5 at start + max(h, w)/merge, which ``text_after_vision="spatial"``
    reproduces."""
    ids = torch.tensor([[1, 2, *video(4, 4, 4), 3, 4]])  # 2 text, start, 16 video, end, 2 text
    kw = {"video_grid_thw": torch.tensor([[4, 4, 4]])}
    extra = {}
    if family == "qwen2_5_vl":
        kw["second_per_grid_ts"] = torch.tensor([0.5])
        extra["tokens_per_second"] = 4  # temporal step 2: ids 3, 5, 7, 9
    want_pos, want_delta = hf_rope_index(hf_models[family], ids, **kw)
    spatial = ours(ids, text_after_vision="spatial", **kw, **extra)
    assert torch.equal(spatial[0], want_pos) and torch.equal(spatial[1], want_delta)

    got, delta = ours(ids, **kw, **extra)
    last_t = 3 + (3 if family == "qwen2_vl" else 6)  # start 3 (after 2 text + vision_start)
    assert int(got[0, 0, 3:19].max()) == last_t
    assert got[:, 0, 19:].tolist() == [list(range(last_t + 1, last_t + 4))] * 3
    assert int(delta) == last_t + 3 + 1 - ids.shape[1]
    assert int(want_pos[0, 0, 19]) <= last_t  # transformers 5: text at ids the video used


def test_adjacent_images_split_by_their_grids():
    """Two images with no token between them form one run; the grids say where it splits."""
    ids = torch.tensor([[1, START, *[IMG] * 4, 2]])
    got, _ = mrope.mrope_position_ids(
        ids,
        image_token_id=IMG,
        video_token_id=VID,
        image_grid_thw=[[1, 2, 4], [1, 4, 2]],
    )
    # image 1 (1x2 tokens) at start 2, image 2 (2x1) at 2 + 2 = 4, text after at 6.
    assert got[:, 0].tolist() == [
        [0, 1, 2, 2, 4, 4, 6],
        [0, 1, 2, 2, 4, 5, 6],
        [0, 1, 2, 3, 4, 4, 6],
    ]


@pytest.mark.parametrize(
    "tokens,kw,match",
    [
        # Two vision_start tokens, one grid row.
        ([*image(1, 2, 2), *image(1, 2, 2)], {"image_grid_thw": [[1, 2, 2]]}, "image_grid_thw"),
        # A grid row whose tokens the sequence does not have.
        ([*image(1, 2, 2)], {"image_grid_thw": [[1, 2, 2], [1, 2, 2]]}, "image_grid_thw"),
        # One grid for an image of 6 tokens: the run holds 4.
        ([*image(1, 2, 4)], {"image_grid_thw": [[1, 4, 6]]}, "image_grid_thw row"),
        # h not divisible by the merge size.
        ([*image(1, 2, 2)], {"image_grid_thw": [[1, 3, 2]]}, r"image_grid_thw\[0\].*divisible"),
        ([*video(1, 2, 2)], {"video_grid_thw": [[1, 2, 5]]}, r"video_grid_thw\[0\].*divisible"),
        # Video tokens but no video grid.
        ([*video(1, 2, 2)], {}, "video_grid_thw describes 0 videos"),
        # vision_start count: a vision item without its start token.
        ([IMG] * 1, {"image_grid_thw": [[1, 2, 2]]}, "vision_start"),
        (
            [*video(2, 2, 2)],
            {"video_grid_thw": [[2, 2, 2]], "second_per_grid_ts": [1.0]},
            "tokens_per_second",
        ),
        ([1], {"text_after_vision": "min"}, "text_after_vision must be one of"),
    ],
)
def test_bad_position_inputs_name_the_field(tokens, kw, match):
    with pytest.raises(ValueError, match=match):
        ours(torch.tensor([tokens]), **kw)


# --- the vision tower's 2D RoPE -----------------------------------------------------------


GRIDS = [[[1, 4, 6]], [[2, 2, 4], [1, 6, 2]]]


@pytest.mark.parametrize("grid", GRIDS, ids=["one_image", "video_and_image"])
def test_vision_rope_matches_transformers(grid):
    pytest.importorskip("transformers")
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import (
        Qwen2VLVisionRotaryEmbedding,
        apply_rotary_pos_emb_vision,
    )
    from transformers.vision_utils import get_vision_position_ids

    grid_thw = torch.tensor(grid)
    positions = mrope.vision_patch_positions(grid_thw, 2)
    assert torch.equal(positions, get_vision_position_ids(grid_thw, 2))

    head_dim = 32
    config = Qwen2VLVisionConfig(embed_dim=2 * head_dim, num_heads=2)
    hf_cos, hf_sin = Qwen2VLVisionRotaryEmbedding(config)(torch.zeros(1), positions)
    cos, sin = mrope.vision_cos_sin(positions, head_dim)
    assert torch.equal(hf_cos[:, :16], hf_cos[:, 16:])
    drift = hf_drift(int(positions.max()))
    torch.testing.assert_close(hf_cos[:, :16], cos, rtol=0, atol=drift)
    torch.testing.assert_close(hf_sin[:, :16], sin, rtol=0, atol=drift)

    # q, k as the tower holds them: (patches, heads, head_dim); posemb wants (1, heads, N, D).
    n = positions.shape[0]
    g = torch.Generator().manual_seed(6)
    q, k = torch.randn(n, 2, head_dim, generator=g), torch.randn(n, 2, head_dim, generator=g)
    want_q, want_k = apply_rotary_pos_emb_vision(q, k, hf_cos, hf_sin)
    got_q, got_k = kernels.rotate(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    bound = 8 * drift + TOL[torch.float32]["atol"]
    torch.testing.assert_close(got_q[0].transpose(0, 1), want_q, rtol=0, atol=bound)
    torch.testing.assert_close(got_k[0].transpose(0, 1), want_k, rtol=0, atol=bound)


def test_vision_tables_follow_rows_then_columns():
    """Pair i < D/4 turns with the row, the rest with the column (by hand for D = 8)."""
    pos = torch.tensor([[3, 5]])
    cos, _ = mrope.vision_cos_sin(pos, 8, base=100.0, dtype=F64)
    theta = torch.tensor([1.0, 0.1], dtype=F64)  # 100^(-2i/4)
    torch.testing.assert_close(cos[0], torch.cos(torch.cat((3 * theta, 5 * theta))))
    with pytest.raises(ValueError, match="head_dim must be a multiple of 4"):
        mrope.vision_cos_sin(pos, 6)
    with pytest.raises(ValueError, match="patch_positions must have shape"):
        mrope.vision_cos_sin(pos[0], 8)


# --- through the fused kernels -------------------------------------------------------------

# (q shape, kv heads): odd length with GQA, one head.
KERNEL_CASES = [((2, 4, 37, 32), 1), ((1, 1, 5, 16), 1)]


@pytest.mark.parametrize("backend", ["cpu", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", KERNEL_CASES, ids=lambda c: "x".join(map(str, c[0])))
@pytest.mark.parametrize("table", ["mrope", "vision"])
def test_tables_through_fused_kernels_forward_and_backward(backend, dtype, case, table):
    (b, h, s, d), kv = case
    device = device_of(backend)
    g = torch.Generator().manual_seed(7)
    if table == "mrope":  # per-sequence 3D positions, interleaved, partial rotary
        section = [2, 1, 1] if d == 16 else [4, 2, 2]
        inv = posemb.inv_freq(d // 2, 1e6, dtype=F64).to(device)
        pos = torch.randint(0, 1 << 16, (3, b, s), generator=g).to(device)
        cos, sin = mrope.mrope_cos_sin(pos, inv, section, interleaved=True)
    else:  # patch positions of one sequence; the same table for every batch entry
        pos = torch.randint(0, 64, (s, 2), generator=g).to(device)
        cos, sin = (t.to(device) for t in mrope.vision_cos_sin(pos.cpu(), d))
    q = torch.randn(b, h, s, d, generator=g).to(device, dtype)
    k = torch.randn(b, kv, s, d, generator=g).to(device, dtype)
    got_q, got_k = kernels.rotate(q, k, cos, sin, backend=backend)
    assert_close(got_q, reference.rotate(q, cos, sin, "half"), dtype)
    assert_close(got_k, reference.rotate(k, cos, sin, "half"), dtype)

    qf, kf = q.clone().requires_grad_(), k.clone().requires_grad_()
    gq, gk = (
        torch.randn(q.shape, generator=g).to(device, dtype),
        torch.randn(k.shape, generator=g).to(device, dtype),
    )
    torch.autograd.backward(kernels.rotate(qf, kf, cos, sin, backend=backend), (gq, gk))
    qr, kr = q.clone().requires_grad_(), k.clone().requires_grad_()
    torch.autograd.backward(
        (reference.rotate(qr, cos, sin, "half"), reference.rotate(kr, cos, sin, "half")), (gq, gk)
    )
    assert_close(qf.grad, qr.grad, dtype)
    assert_close(kf.grad, kr.grad, dtype)


def test_module_positions_are_checked_against_q():
    emb = mrope.MRotaryEmbedding(16, mrope_section=[2, 3, 3], backend="reference")
    q = torch.zeros(2, 1, 5, 16)
    with pytest.raises(ValueError, match=r"positions must cover \(3, 2 or 1, 5\)"):
        emb(q, q, torch.zeros(3, 2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="positions must have shape"):
        emb(q, q, torch.zeros(2, 3, 2, 5, dtype=torch.long))
    out_q, _ = emb(q + 1, q)  # default positions 0..seq-1 on every axis
    assert torch.equal(out_q[:, :, 0], torch.ones(2, 1, 16))
    assert "interleaved=False" in repr(emb) and emb.describe().startswith("pairs 0-1 temporal")


def test_mrope_scaling_is_checked_and_none_is_the_default():
    m = posemb.MRotaryEmbedding(16, mrope_section=[2, 3, 3])
    m.scaling = None  # raised AttributeError at the next call
    assert m.scaling == posemb.scaling.Default()
    with pytest.raises(ValueError, match="scaling must be a posemb"):
        m.scaling = "yarn"
