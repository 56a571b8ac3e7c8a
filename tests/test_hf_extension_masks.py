"""hf.patch_extension against the same model unpatched, under every mask and cache form
transformers hands an attention function (issue 48, bugs 1-6, 8 and 9; 7 is about memory).

An extension whose window is wider than every distance here rotates each pair by its plain
distance, so the patched model must give the unpatched model's logits (float32 roundings apart);
where a call has to be refused, the refusal must come before anything changes. Each test fails on
the code the issue was filed against.

flash_attention_2 cannot run here (no kernel): its *form* is registered under another name, the
mask transformers builds for flash attention (None, or the 2-D padding mask) paired with an
exact attention that reads ``sliding_window`` and ``is_causal`` as the flash integration does.
"""

from __future__ import annotations

import pytest
import torch

import posemb
from posemb import hf

transformers = pytest.importorskip("transformers")
pytest.importorskip("hf_reference")  # quiets transformers' logging

from transformers.masking_utils import (  # noqa: E402
    AttentionMaskInterface,
    flash_attention_mask,
)

TINY = {
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 96,
    "max_position_embeddings": 64,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
# Layer 0 sliding, layer 1 global: the only layer patch_extension extends is the second one.
GEMMA3 = {
    "layer_types": ["sliding_attention", "full_attention"],
    "sliding_window": 4,
    "query_pre_attn_scalar": 16,
}
WIDE = posemb.SelfExtend(group=4, window=10_000)  # plain RoPE at every distance in these tests
ATOL = 1e-5  # float64 angles against transformers' float32 tables: a few float32 roundings
FA2_FORM = "posemb_test_fa2_form"


def _fa2_form_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout=0.0,
    scaling=None,
    sliding_window=None,
    is_causal=None,
    **kwargs,
):
    """What transformers' flash_attention_forward computes, exactly and on the CPU: causal from
    the ``is_causal`` keyword or the module, the window as flash's ``window_size=(w - 1, w - 1)``
    (one-sided when causal), padding from the 2-D mask (its last ``T`` columns); a query that
    sees nothing gives zeros, as unpadding does. Packed sequences: one row without a mask whose
    position_ids restart is split where the position is the row's lowest (transformers'
    _is_packed_sequence and prepare_fa_kwargs_from_position_ids)."""
    b, h, s, d = query.shape
    t = key.shape[2]
    causal = module.is_causal if is_causal is None else is_causal
    qi = torch.arange(t - s, t)[:, None]
    kj = torch.arange(t)[None, :]
    seen = torch.ones(s, t, dtype=torch.bool)
    if causal:
        seen &= kj <= qi
    if sliding_window is not None:
        seen &= (qi - kj).abs() < sliding_window
    pos = kwargs.get("position_ids")
    if attention_mask is None and b == 1 and s > 1 and pos is not None:
        pos = pos.reshape(-1)
        if bool((pos - pos.min() != torch.arange(s)).any()):
            segment = (pos == pos.min()).long().cumsum(0)
            seen &= segment[:, None] == segment[None, :]
    seen = seen.expand(b, 1, s, t)
    if attention_mask is not None:
        seen = seen & attention_mask[:, None, None, -t:].bool()
    k = key.repeat_interleave(h // key.shape[1], 1)
    v = value.repeat_interleave(h // value.shape[1], 1)
    logits = query @ k.transpose(-1, -2) * (d**-0.5 if scaling is None else scaling)
    p = torch.softmax(logits.masked_fill(~seen, float("-inf")), -1).nan_to_num(0.0)
    return (p @ v).transpose(1, 2).contiguous(), None


transformers.AttentionInterface.register(FA2_FORM, _fa2_form_attention)
AttentionMaskInterface.register(FA2_FORM, flash_attention_mask)


def build(model_type: str, implementation: str = "sdpa", **config) -> torch.nn.Module:
    """A random float32 model, default RoPE (the families' published scalings are beside the
    point here, and some of them read partial_rotary_factor, which bug 8 needs ignored)."""
    cfg = transformers.AutoConfig.for_model(model_type, **{**TINY, **config})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=implementation)
    return model.eval()


def ids(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, 96, (batch, length), generator=torch.Generator().manual_seed(seed))


def padding(batch: int, length: int, side: str, pad: int = 3) -> torch.Tensor:
    """A 2-D mask whose last row has ``pad`` padding tokens on ``side`` (none for "none")."""
    mask = torch.ones(batch, length, dtype=torch.long)
    if side == "left":
        mask[-1, :pad] = 0
    elif side == "right":
        mask[-1, length - pad :] = 0
    return mask


def gap(got: torch.Tensor, want: torch.Tensor, keep: torch.Tensor | None = None) -> float:
    """The largest difference, over the positions ``keep`` marks (a padding token's output is
    whatever the implementation leaves there)."""
    diff = (got - want).abs()
    return float((diff if keep is None else diff[keep.bool()]).max())


def lengths(cache) -> list[int]:
    return [cache.get_seq_length(i) for i in range(len(cache.layers))]


def keys(cache) -> list[torch.Tensor | None]:
    return [layer.keys.clone() if layer.is_initialized else None for layer in cache.layers]


def same_keys(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        (x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))
        for x, y in zip(a, b, strict=True)
    )


# --- 1. flash_attention_2's sliding window ---------------------------------------------------


@pytest.mark.parametrize("side", ["none", "left", "right"])
def test_the_flash_attention_2_form_keeps_the_sliding_window(side):
    """Mistral under flash attention: no 4-D mask, the window only as the ``sliding_window``
    keyword; 12 tokens against a window of 4."""
    model = build("mistral", FA2_FORM, sliding_window=4)
    x, mask = ids(2, 12), padding(2, 12, side)
    with torch.no_grad():
        want = model(x, attention_mask=mask).logits
        model.config._attn_implementation = "sdpa"
        # The reference is transformers' own sliding window (sdpa's 4-D mask).
        assert gap(model(x, attention_mask=mask).logits, want, mask) <= ATOL
        model.config._attn_implementation = FA2_FORM
        hf.patch_extension(model, WIDE)
        got = model(x, attention_mask=mask).logits
    assert gap(got, want, mask) <= ATOL


# --- 2. a bidirectional model stays bidirectional ----------------------------------------------


@pytest.mark.skipif(
    not hasattr(getattr(transformers, "Gemma3TextConfig", None), "use_bidirectional_attention"),
    reason="this transformers' Gemma 3 has no use_bidirectional_attention",
)
@pytest.mark.parametrize("side", ["left", "right"])
def test_the_flash_attention_2_form_keeps_bidirectional_gemma3_bidirectional(side):
    """A padded batch reaches a flash attention as a 2-D padding mask; the module's ``is_causal``
    (False) says whether to add causality."""
    model = build("gemma3_text", FA2_FORM, use_bidirectional_attention=True, **GEMMA3)
    x, mask = ids(2, 10), padding(2, 10, side)
    with torch.no_grad():
        want = model(x, attention_mask=mask).logits
        model.config._attn_implementation = "sdpa"
        assert gap(model(x, attention_mask=mask).logits, want, mask) <= ATOL
        model.config._attn_implementation = FA2_FORM
        assert hf.patch_extension(model, WIDE) == ["model.layers.1.self_attn"]
        got = model(x, attention_mask=mask).logits
    assert gap(got, want, mask) <= ATOL


# --- 3. custom 4-D additive masks with a finite fill -------------------------------------------


def _packed(fill: float, length: int = 12, cut: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """Two documents packed in one row: a block-diagonal causal additive mask whose hidden
    entries are ``fill``, and positions that start again at the second document."""
    doc = torch.arange(length) >= cut
    seen = (doc[:, None] == doc[None, :]) & torch.ones(length, length, dtype=torch.bool).tril()
    mask = torch.zeros(1, 1, length, length).masked_fill(~seen, fill)
    positions = torch.cat((torch.arange(cut), torch.arange(length - cut)))[None]
    return mask, positions


@pytest.mark.parametrize("fill", [-1e4, -1e9])
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_a_custom_additive_mask_hides_what_its_finite_fill_hides(implementation, fill):
    """transformers adds a 4-D float mask to the logits as given: exp(-1e4) is 0 in float32, so
    the plain model never sees the other document."""
    model = build("llama", implementation)
    x = ids(1, 12)
    mask, positions = _packed(fill)
    with torch.no_grad():
        want = model(x, attention_mask=mask, position_ids=positions).logits
        hf.patch_extension(model, WIDE)
        got = model(x, attention_mask=mask, position_ids=positions).logits
    assert gap(got, want) <= ATOL


# --- 4. flex_attention's BlockMask ---------------------------------------------------------------


def test_flex_attention_block_mask_gives_the_plain_logits():
    """flex_attention hands the attention a BlockMask (not a tensor), here for a left-padded
    batch with a cache. The reference is the plain model under sdpa (the same attention: flex
    compiles its kernel on first use, several seconds on a CPU); building the mask compiles too,
    about 3 s, once."""
    try:
        model = build("llama", "flex_attention")
    except (ImportError, ValueError, RuntimeError) as e:  # pragma: no cover
        pytest.skip(f"flex_attention does not load here: {e}")
    x, mask = ids(2, 10), padding(2, 10, "left")
    with torch.no_grad():
        model.config._attn_implementation = "sdpa"
        want = model(x, attention_mask=mask).logits
        model.config._attn_implementation = "flex_attention"
        hf.patch_extension(model, WIDE)
        cache = transformers.DynamicCache(config=model.config)
        got = model(x, attention_mask=mask, cache=cache).logits
    assert gap(got, want, mask) <= ATOL


def _recording(made):
    """A wrapper of a mask function of a tile that records each tile's pairs."""

    def wrap(allow):
        def recorded(r0, r1, c0, c1):
            made.append((r1 - r0) * (c1 - c0))
            return allow(r0, r1, c0, c1)

        return recorded

    return wrap


@pytest.mark.parametrize("implementation", ["flex_attention", "eager"])
def test_a_block_mask_and_a_4d_mask_are_read_per_tile(implementation, monkeypatch):
    """Issue 55: a BlockMask was expanded over every (query, key) pair (create_mask over q x
    k) and a 4-D mask's causality checked whole; now each is read per tile of the calls (and
    per block of rows for causality). With tiles far smaller than the call, nothing posemb
    reads of a mask holds the call's grid."""
    from posemb.attention import core
    from posemb.hf import extension_masks

    monkeypatch.setattr(core, "_ROWS", 16)
    monkeypatch.setattr(core, "_LEAF", 8)
    monkeypatch.setattr(core, "_TILE", 128)
    monkeypatch.setattr(extension_masks, "_CHUNK", 256)
    made: list[int] = []
    wrap = _recording(made)
    real_hides, real_block = extension_masks._hides_later, extension_masks._block_mask_allow
    monkeypatch.setattr(
        extension_masks, "_hides_later", lambda allow, qp, kp: real_hides(wrap(allow), qp, kp)
    )
    monkeypatch.setattr(
        extension_masks, "_block_mask_allow", lambda mask, b: wrap(real_block(mask, b))
    )
    try:
        model = build("llama", implementation)
    except (ImportError, ValueError, RuntimeError) as e:  # pragma: no cover
        pytest.skip(f"{implementation} does not load here: {e}")
    x, mask = ids(2, 40), padding(2, 40, "left")
    with torch.no_grad():
        model.config._attn_implementation = "sdpa"
        want = model(x, attention_mask=mask).logits
        model.config._attn_implementation = implementation
        hf.patch_extension(model, WIDE)
        got = model(x, attention_mask=mask, cache=transformers.DynamicCache(config=model.config))
    assert gap(got.logits, want, mask) <= ATOL
    assert made and max(made) < 40 * 40


# --- 5. crop of a sliding cache (assisted / prompt-lookup decoding) ------------------------------


def test_a_sliding_cache_cropped_past_its_window_goes_on_with_the_plain_logits():
    """What assisted decoding does to a sliding layer: record the past, then crop the rejected
    tokens; transformers keeps the last ``sliding_window - 1`` keys before them."""
    model = build("mistral", "sdpa", sliding_window=6)
    x = ids(1, 38)

    def run():
        cache = transformers.DynamicCache(config=model.config)
        cache.activate_past_recording()
        model(x[:, :30], cache=cache)
        model(x[:, 30:34], cache=cache)
        cache.crop(-2)
        return model(x[:, 32:], cache=cache).logits

    with torch.no_grad():
        want = run()
        hf.patch_extension(model, WIDE)
        got = run()
    assert gap(got, want) <= ATOL


def test_prompt_lookup_decoding_with_a_sliding_cache_gives_the_plain_logits():
    """A repetitive prompt longer than the window, so candidates are proposed and some rejected
    (the cache cropped)."""
    model = build("mistral", "sdpa", sliding_window=6)
    block = ids(1, 6, seed=3)
    prompt = torch.cat((block, block, block), 1)
    kw = {
        "max_new_tokens": 6,
        "do_sample": False,
        "min_length": 0,
        "prompt_lookup_num_tokens": 3,
        "output_logits": True,
        "return_dict_in_generate": True,
    }
    with torch.no_grad():
        want = model.generate(prompt, **kw)
        hf.patch_extension(model, WIDE)
        got = model.generate(prompt, **kw)
    assert torch.equal(got.sequences, want.sequences)
    assert gap(torch.stack(got.logits), torch.stack(want.logits)) <= ATOL


# --- 6. a refused call changes nothing -----------------------------------------------------------


def test_a_call_refused_for_attention_dropout_leaves_the_cache_unchanged():
    model = build("llama", "sdpa", attention_dropout=0.1)
    hf.patch_extension(model, WIDE)
    x = ids(1, 12)
    with torch.no_grad():
        cache = transformers.DynamicCache(config=model.config)
        model(x[:, :8], cache=cache)
        held, before = keys(cache), lengths(cache)
        model.train()
        with pytest.raises(ValueError, match="dropout"):
            model(x[:, 8:], cache=cache)
        model.eval()
        assert lengths(cache) == before
        assert same_keys(keys(cache), held)
        # The run goes on as if the refused call had never been made.
        step = model(x[:, 8:], cache=cache).logits
        assert gap(step, model(x).logits[:, 8:]) <= ATOL


def test_gemma3_refuses_a_plain_cache_before_its_sliding_layer_appends():
    """A cache plain transformers filled: the patched model can only tell at its global layer
    (layer 1), but the sliding layer 0, not patched, runs first."""
    model = build("gemma3_text", "sdpa", **GEMMA3)
    x = ids(1, 12)
    with torch.no_grad():
        want = model(x).logits[:, 8:]
        cache = transformers.DynamicCache(config=model.config)
        model(x[:, :8], cache=cache)
        held, before = keys(cache), lengths(cache)
        hf.patch_extension(model, WIDE)
        with pytest.raises(ValueError, match="cache"):
            model(x[:, 8:], cache=cache)
        assert lengths(cache) == before
        assert same_keys(keys(cache), held)
        # Still a plain cache: the plain model goes on from it.
        hf.unpatch_extension(model)
        step = model(x[:, 8:], cache=cache).logits
    assert gap(step, want) <= ATOL


# --- 8. a rotary width transformers ignores ----------------------------------------------------


def _float_positions(model, cache, x):
    model(x, cache=cache, position_ids=torch.arange(8, 12.0)[None])


def _unpatched(model, cache, x):
    hf.unpatch_extension(model)
    try:
        model(x, cache=cache)
    finally:
        hf.patch_extension(model, WIDE)


def _in_training(model, cache, x):
    model.train()
    try:
        model(x, cache=cache)
    finally:
        model.eval()


@pytest.mark.parametrize(
    ("call", "said"),
    [(_in_training, "dropout"), (_float_positions, "integer"), (_unpatched, "unrotated")],
    ids=["dropout", "float-positions", "unpatched"],
)
def test_gemma3_refuses_before_its_unpatched_sliding_layer_appends(call, said):
    """Found by an attack: what the patched global layer refuses (dropout, position_ids, an
    unpatched model reading a patched cache) was refused after Gemma 3's sliding layer 0, not
    patched, had appended; the text model's pre-hook refuses it before layer 0."""
    model = build("gemma3_text", "sdpa", **GEMMA3, attention_dropout=0.1)
    hf.patch_extension(model, WIDE)
    x = ids(1, 12)
    with torch.no_grad():
        want = model(x).logits[:, 8:]
        cache = transformers.DynamicCache(config=model.config)
        model(x[:, :8], cache=cache)
        held, before = keys(cache), lengths(cache)
        with pytest.raises(ValueError, match=said):
            call(model, cache, x[:, 8:])
        assert lengths(cache) == before
        assert same_keys(keys(cache), held)
        assert gap(model(x[:, 8:], cache=cache).logits, want) <= ATOL


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_a_partial_rotary_factor_transformers_ignores_is_followed_or_refused(model_type):
    """Llama's and Qwen3's default RoPE rotate every channel whatever partial_rotary_factor says;
    the patched model must rotate the channels the plain one does, or refuse by name. A silent
    difference is the bug."""
    model = build(model_type, "sdpa", partial_rotary_factor=0.5)
    x = ids(2, 12)
    with torch.no_grad():
        want = model(x).logits
        try:
            hf.patch_extension(model, WIDE)
        except ValueError as e:
            assert "partial_rotary_factor" in str(e)
            return
        got = model(x).logits
    assert gap(got, want) <= ATOL


# --- 9. beam search on a left-padded batch ------------------------------------------------------


def test_beam_search_on_a_left_padded_batch_gives_the_plain_beams():
    """Beam search reorders the cache's rows every step; the rows of a left-padded batch hold
    keys at different positions."""
    model = build("llama", "sdpa")
    mask = padding(2, 8, "left")
    x = ids(2, 8) * mask
    kw = {
        "attention_mask": mask,
        "max_new_tokens": 5,
        "num_beams": 2,
        "do_sample": False,
        "min_length": 0,
        "output_scores": True,
        "return_dict_in_generate": True,
    }
    with torch.no_grad():
        want = model.generate(x, **kw)
        hf.patch_extension(model, WIDE)
        got = model.generate(x, **kw)
    assert torch.equal(got.sequences, want.sequences)
    assert gap(got.sequences_scores, want.sequences_scores) <= ATOL


# --- issue 54, bug 7: causality by index, as is_causal means it -------------------------------


@pytest.mark.parametrize("implementation", ["sdpa", "eager", FA2_FORM])
def test_two_sequences_packed_in_one_row_attend_by_index_as_transformers_does(implementation):
    """With the default cache transformers passes sdpa no mask and means ``is_causal``:
    causality by key *index*. Two sequences packed in one row (position_ids 0..39, 0..29) are
    one sequence to it: the first one's tokens never see the second's, which come after them.
    posemb read the mask-less form as causal by *position* and let them (logits off by 0.33)."""
    plain, patched = build("llama", implementation), build("llama", implementation)
    hf.patch_extension(patched, WIDE)
    x = ids(1, 70)
    positions = torch.cat((torch.arange(40), torch.arange(30)))[None]
    with torch.no_grad():
        want = plain(x, position_ids=positions).logits
        got = patched(x, position_ids=positions).logits
        alone = patched(x[:, :40], position_ids=positions[:, :40]).logits
        second = patched(x[:, 40:], position_ids=positions[:, 40:]).logits
    assert gap(got, want) <= ATOL
    assert gap(got[:, :40], alone) <= ATOL
    # Flash attention splits the packed row where its positions restart; sdpa and eager do not
    # (with a cache transformers builds them no packed mask).
    split = gap(got[:, 40:], second)
    assert split <= ATOL if implementation == FA2_FORM else split > 1e-3


def test_flash_attention_cu_seq_lens_split_the_row_they_describe():
    """Flash attention's padding-free form passes the sequence boundaries themselves
    (``cu_seq_lens_q``/``_k``, as DataCollatorWithFlattening does): each sequence attends
    alone, whatever its positions; a batch of several rows with them is refused by name."""
    patched = build("llama", FA2_FORM)
    hf.patch_extension(patched, WIDE)
    x = ids(1, 70)
    positions = torch.arange(70)[None]
    cu = torch.tensor([0, 40, 70], dtype=torch.int32)
    lens = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": 40, "max_length_k": 40}
    with torch.no_grad():
        got = patched(x, position_ids=positions, use_cache=False, **lens).logits
        first = patched(x[:, :40], position_ids=positions[:, :40], use_cache=False).logits
        second = patched(x[:, 40:], position_ids=positions[:, 40:], use_cache=False).logits
        assert gap(got, torch.cat((first, second), 1)) <= ATOL
        with pytest.raises(posemb.InputError, match="cu_seq_lens_k for one row"):
            patched(ids(2, 70), position_ids=positions, use_cache=False, **lens)
