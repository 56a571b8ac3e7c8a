"""Each vision preset of AxialRotaryEmbedding against the module it names, built from a published
vision_config (tests/data/hf_configs and tests/data/vision_configs), and against torchtune.

transformers forms its angles in float32, so each of its angles is off by up to half an ulp of
the angle; a channel moves by that much times its size. The bound below is twice that, from
the largest angle of the case, plus 1e-6 for the rounding of the products.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest
import torch

from posemb import AxialRotaryEmbedding

transformers = pytest.importorskip("transformers")

DATA = pathlib.Path(__file__).parent / "data"
EPS = torch.finfo(torch.float32).eps


def vision_config(name: str, cls_name: str) -> object:
    """The transformers config of a published vision tower, from its fixture."""
    path = DATA / "hf_configs" / name
    if path.exists():
        block = json.loads(path.read_text())["vision_config"]
    else:
        block = json.loads((DATA / "vision_configs" / name).read_text())
    return getattr(transformers, cls_name)(**block)


def heads_of(config: object) -> int:
    return getattr(config, "num_attention_heads", None) or config.num_heads


def head_dim(config: object) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // heads_of(config)


def within_rounding(ours, theirs, largest_angle: float, x: torch.Tensor, label: str) -> float:
    worst = max(float((a - b).abs().max()) for a, b in zip(ours, theirs, strict=True))
    bound = 2 * EPS * largest_angle * float(x.abs().max()) + 1e-6
    assert worst < bound, (label, worst, bound)
    print(f"{label}: worst difference {worst:.2e} (bound {bound:.1e})")
    return worst


def qk(tokens: int, heads: int, dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, heads, tokens, dim, generator=g), torch.randn(
        1, heads, tokens, dim, generator=g
    )


@pytest.mark.parametrize(
    ("preset", "fixture", "cls_name", "module_path"),
    [
        ("qwen2_5_vl", "qwen2_5_vl__qwen2.5-vl-7b-instruct.json", "Qwen2_5_VLVisionConfig",
         "qwen2_5_vl.modeling_qwen2_5_vl.Qwen2_5_VLVisionRotaryEmbedding"),
        ("qwen3_vl", "qwen3_vl__qwen3-vl-8b-instruct.json", "Qwen3VLVisionConfig",
         "qwen3_vl.modeling_qwen3_vl.Qwen3VLVisionRotaryEmbedding"),
        ("qwen3_5", "qwen3_5__qwen3.5-9b.json", "Qwen3_5VisionConfig",
         "qwen3_5.modeling_qwen3_5.Qwen3_5VisionRotaryEmbedding"),
        ("glm4v", "glm4v__glm-4.1v-9b-thinking.json", "Glm4vVisionConfig",
         "glm4v.modeling_glm4v.Glm4vVisionRotaryEmbedding"),
        ("exaone4_5", "exaone4_5__exaone-4.5-33b.json", "Exaone4_5_VisionConfig",
         "exaone4_5.modeling_exaone4_5.Exaone4_5_VisionRotaryEmbedding"),
    ],
)  # fmt: skip
def test_the_qwen_vision_presets_from_published_configs(preset, fixture, cls_name, module_path):
    config = vision_config(fixture, cls_name)
    mod_name, cls = module_path.rsplit(".", 1)
    m = __import__(f"transformers.models.{mod_name}", fromlist=[cls])
    theirs = getattr(m, cls)(config)
    d, heads = head_dim(config), heads_of(config)
    ours = AxialRotaryEmbedding.preset(preset, d, base=config.rope_parameters["rope_theta"])
    pos = ours.grid(12, 9)  # (h, w), as the Qwen towers take them
    q, k = qk(pos.shape[0], heads, d, seed=d)
    cos, sin = theirs(q, pos.long())
    tq, tk = m.apply_rotary_pos_emb_vision(q[0].transpose(0, 1), k[0].transpose(0, 1), cos, sin)
    oq, ok = ours(q, k, pos)
    mine = (oq[0].transpose(0, 1), ok[0].transpose(0, 1))
    within_rounding(mine, (tq, tk), 11.0, torch.cat((q, k)), f"{preset} head_dim {d}")


def test_the_llama4_preset_from_the_published_scout_config():
    from transformers.models.llama4 import modeling_llama4 as m

    config = vision_config("llama4__llama-4-scout-17b-16e-instruct.json", "Llama4VisionConfig")
    d, heads = head_dim(config), config.num_attention_heads
    side = config.image_size // config.patch_size
    ours = AxialRotaryEmbedding.preset("llama4", d, base=config.rope_parameters["rope_theta"])
    pos = ours.grid(side, side, cls="last")  # (x + 1, y + 1), the class token last
    q, k = qk(pos.shape[0], heads, d, seed=1)
    freqs_ci = m.Llama4VisionRotaryEmbedding(config)(q)
    tq, tk = m.vision_apply_rotary_emb(q.transpose(1, 2), k.transpose(1, 2), freqs_ci)
    oq, ok = ours(q, k, pos)
    mine = (oq.transpose(1, 2), ok.transpose(1, 2))
    within_rounding(mine, (tq, tk), float(side), torch.cat((q, k)), f"llama4 head_dim {d}")
    torch.testing.assert_close(oq[:, :, -1], q[:, :, -1], rtol=0, atol=0)  # CLS unrotated


def _torchtune_vision_rope():
    """torchtune's module file alone: its package imports torchao and more on import."""
    spec = importlib.util.find_spec("torchtune")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("torchtune is not installed (make .venv/.installed-dev installs it)")
    path = pathlib.Path(spec.submodule_search_locations[0]) / "modules" / "position_embeddings.py"
    loader = importlib.util.spec_from_file_location("_torchtune_position_embeddings", path)
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    return module.VisionRotaryPositionalEmbeddings


@pytest.mark.parametrize("cls_at", ["last", "first"])
def test_the_llama4_preset_is_torchtunes_vision_rope(cls_at):
    theirs_cls = _torchtune_vision_rope()
    d, heads, patch, tile = 64, 4, 14, 14 * 7
    theirs = theirs_cls(patch, tile, max_num_tiles=1, dim=d // 2, append_cls_token=cls_at == "last")
    ours = AxialRotaryEmbedding.preset("llama4", d)
    pos = ours.grid(7, 7, cls=cls_at)
    q, k = qk(pos.shape[0], heads, d, seed=2)
    oq, ok = ours(q, k, pos)
    tq, tk = theirs(q.transpose(1, 2)), theirs(k.transpose(1, 2))
    mine = (oq.transpose(1, 2), ok.transpose(1, 2))
    within_rounding(mine, (tq, tk), 7.0, torch.cat((q, k)), f"torchtune (cls {cls_at})")


@pytest.mark.parametrize("fixture", ["gemma4__gemma-4-31b-it.json", "gemma4__gemma-4-e2b-it.json"])
def test_the_gemma4_preset_from_published_configs(fixture):
    from transformers.models.gemma4 import modeling_gemma4 as m

    config = vision_config(fixture, "Gemma4VisionConfig")
    d, heads = head_dim(config), config.num_attention_heads
    ours = AxialRotaryEmbedding.preset("gemma4", d, base=config.rope_parameters["rope_theta"])
    pos = ours.grid(6, 10)  # (x, y)
    q, k = qk(pos.shape[0], heads, d, seed=d)
    ids = pos.long()[None]
    cos, sin = m.Gemma4VisionRotaryEmbedding(config)(q, ids)
    tq = m.apply_multidimensional_rope(q.transpose(1, 2), cos, sin, ids)
    tk = m.apply_multidimensional_rope(k.transpose(1, 2), cos, sin, ids)
    oq, ok = ours(q, k, pos)
    mine = (oq.transpose(1, 2), ok.transpose(1, 2))
    within_rounding(mine, (tq, tk), 9.0, torch.cat((q, k)), f"gemma4 head_dim {d}")


def test_the_pixtral_preset_from_a_published_config():
    from transformers.models.pixtral import modeling_pixtral as m

    config = vision_config("mistral3__devstral-small-2-24b-instruct.json", "PixtralVisionConfig")
    d, heads = head_dim(config), config.num_attention_heads
    ours = AxialRotaryEmbedding.preset("pixtral", d, base=config.rope_parameters["rope_theta"])
    pos = ours.grid(9, 13)
    q, k = qk(pos.shape[0], heads, d, seed=3)
    cos, sin = m.PixtralVisionRotaryEmbedding(config)(q, pos.long())
    tq, tk = m.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=0)
    within_rounding(ours(q, k, pos), (tq, tk), 12.0, torch.cat((q, k)), f"pixtral head_dim {d}")


def test_grid_with_merge_is_the_token_order_transformers_gives_the_qwen_towers():
    from transformers.vision_utils import get_vision_position_ids

    rope = AxialRotaryEmbedding.preset("qwen2_5_vl", 80)
    for h, w in ((4, 6), (8, 2)):
        theirs = get_vision_position_ids(torch.tensor([[1, h, w]]), 2)
        assert torch.equal(rope.grid(h, w, merge=2).long(), theirs)
    with pytest.raises(ValueError, match="merge 2 must divide"):
        rope.grid(3, 4, merge=2)


def test_gemma4_grid_is_the_image_processors_position_ids():
    np = pytest.importorskip("numpy")
    pytest.importorskip("PIL")
    from transformers.models.gemma4 import image_processing_pil_gemma4 as m

    image = np.random.default_rng(0).integers(0, 255, (48, 64, 3), dtype=np.uint8)
    out = m.Gemma4ImageProcessorPil()(images=[image], do_resize=False, return_tensors="pt")
    ids = out["image_position_ids"][0]  # (x, y) per patch, then (-1, -1) padding
    grid = AxialRotaryEmbedding.preset("gemma4", 64).grid(48 // 16, 64 // 16)
    assert torch.equal(ids[: len(grid)].long(), grid.long())
    assert (ids[len(grid) :] == -1).all()
