"""hf.patch_extension in tiny transformers models shrunk from published configs: the logits of
an attention written from the definitions, generate with the cache equal to recomputing, and
every refusal with nothing changed.

The reference model is the unpatched model with its rotation switched off (the family's
``apply_rotary_pos_emb`` monkeypatched to return q and k as they are) and an attention function
registered with transformers that rotates each pair by the distance of
``extension_definitions`` (one (i, j) pair at a time), from transformers' own ``inv_freq`` and
attention factor. Nothing of posemb's runs in it.
"""

from __future__ import annotations

import copy
import json
import math
import pathlib
import pickle
import sys

import pytest
import torch

import posemb
from extension_definitions import reference_distance
from posemb import InputError, hf
from tolerances import assert_close

transformers = pytest.importorskip("transformers")
pytest.importorskip("hf_reference")  # quiets transformers' logging

DATA = pathlib.Path(__file__).parent / "data" / "hf_configs"
F64 = torch.float64
TRAINED = 32  # every tiny model's max_position_embeddings
SMALL = {
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 96,
    "max_position_embeddings": TRAINED,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
PUBLISHED = {
    "llama": "llama__llama-3.2-1b-instruct.json",
    "qwen3": "qwen3__qwen3-32b.json",
    "qwen2": "qwen2__qwen2.5-7b-instruct.json",
    "gemma3_text": "gemma3__gemma-3-4b-it.json",
}
METHODS = {
    "selfextend": posemb.SelfExtend(group=4, window=8),
    "selfextend-scaled": posemb.SelfExtend(group=3, window=6, query_scale=TRAINED),
    "rerope": posemb.ReRoPE(window=12),
    "leaky": posemb.ReRoPE(window=10, leak=4.0),
    "dca": posemb.DualChunk(chunk_size=TRAINED, local_size=8),
}


def tiny(family: str, dtype=torch.float32, **sizes) -> torch.nn.Module:
    """A random model of a published config's family and RoPE, its sizes shrunk."""
    if family == "mistral":
        text = {"model_type": "mistral", "rope_theta": 1e6, "sliding_window": None}
    else:
        d = json.loads((DATA / PUBLISHED[family]).read_text())
        text = dict(d.get("text_config", d))
    text.update(SMALL)
    if family == "gemma3_text":
        text.update(model_type="gemma3_text", num_hidden_layers=3, sliding_window=8)
        text["layer_types"] = ["sliding_attention", "full_attention", "sliding_attention"]
    text.update(sizes)
    mt = text.pop("model_type")
    text.pop("quantization_config", None)
    cfg = transformers.AutoConfig.for_model(mt, **text)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()


def ids(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, 96, (batch, length), generator=torch.Generator().manual_seed(seed))


def _definition_attention(method):
    """softmax_j(<R(d_ij) q_i, k_j> * scaling) for unrotated q and k, d_ij from the definitions,
    in float64; the causal mask from the positions, the query scaling where the method asks."""

    def attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
        rotary = module._definition_rotary
        inv = rotary.inv_freq.to(F64)
        factor = float(rotary.attention_scaling)
        pos = kwargs["position_ids"][0].tolist()
        d = torch.tensor([[reference_distance(method, i, j) for j in pos] for i in pos], dtype=F64)
        seen = torch.tensor([[j <= i for j in pos] for i in pos])
        q, k = query.to(F64), key.to(F64).repeat_interleave(query.shape[1] // key.shape[1], 1)
        if method.query_scale is not None:
            n = math.log(method.query_scale)
            temper = torch.tensor([max(1.0, math.log(i + 1) / n) for i in pos], dtype=F64)
            q = q * temper[:, None]
        half = inv.numel()
        qa, qb, ka, kb = q[..., :half], q[..., half:], k[..., :half], k[..., half:]
        angle = d[..., None] * inv  # (i, j, pairs)
        # <R(d) q, k> per channel pair (c, c + half): cos(qa ka + qb kb) + sin(qa kb - qb ka)
        dots = torch.einsum("bhic,bhjc->bhijc", qa, ka) + torch.einsum("bhic,bhjc->bhijc", qb, kb)
        cross = torch.einsum("bhic,bhjc->bhijc", qa, kb) - torch.einsum("bhic,bhjc->bhijc", qb, ka)
        logits = (dots * angle.cos() + cross * angle.sin()).sum(-1) * factor**2 * scaling
        p = torch.softmax(logits.masked_fill(~seen, float("-inf")), -1)
        vv = value.to(F64).repeat_interleave(query.shape[1] // value.shape[1], 1)
        return (p @ vv).to(query.dtype).transpose(1, 2).contiguous(), None

    return attention


@pytest.fixture
def definition(monkeypatch):
    """Turn a model into the reference: no rotation, the definition's attention."""

    def make(model, method):
        module = sys.modules[type(model).__module__]
        monkeypatch.setattr(module, "apply_rotary_pos_emb", lambda q, k, *a, **kw: (q, k))
        transformers.AttentionInterface.register("posemb_definition", _definition_attention(method))
        for layer in model.model.layers:
            layer.self_attn._definition_rotary = model.model.rotary_emb
        model.config._attn_implementation = "posemb_definition"
        return model

    return make


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("method", list(METHODS.values()), ids=list(METHODS))
@pytest.mark.parametrize("length", [3 * TRAINED, 5 * TRAINED + 7])
def test_patched_logits_are_the_definition_past_the_training_length(
    family, method, length, definition
):
    model = tiny(family, F64)
    x = ids(1, length)
    with torch.no_grad():
        hf.patch_extension(model, method)
        got = model(x).logits
        hf.unpatch_extension(model)
        plain = model(x).logits
        want = definition(model, method)(x).logits
    # A float64 model, but the reference's frequencies are transformers' inv_freq, formed in
    # float32 (posemb's are float64): the float32 row of the table.
    assert_close(got, want, torch.float32)
    assert float((plain - want).abs().max()) > 1e-4  # the method changed the logits


@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen2", "mistral", "gemma3_text"])
def test_inside_the_window_the_patched_model_is_the_plain_model(family):
    model = tiny(family)
    x = ids(2, 3 * TRAINED)
    with torch.no_grad():
        want = model(x).logits
        hf.patch_extension(model, posemb.SelfExtend(group=4, window=4 * TRAINED))
        got = model(x).logits
    # float64 angles against transformers' float32 tables: a few float32 roundings.
    assert float((got - want).abs().max()) <= 1e-5


def _recompute(model, prompt: torch.Tensor, steps: int) -> torch.Tensor:
    seq = prompt
    for _ in range(steps):
        nxt = model(seq, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat((seq, nxt), 1)
    return seq


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3_text"])
@pytest.mark.parametrize("method", ["selfextend", "leaky", "dca"])
def test_greedy_generate_with_the_cache_gives_the_tokens_of_recomputing(family, method):
    model = tiny(family)
    hf.patch_extension(model, METHODS[method])
    prompt = ids(1, 2 * TRAINED)
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=2 * TRAINED, do_sample=False, min_length=0)
        want = _recompute(model, prompt, out.shape[1] - prompt.shape[1])
    assert torch.equal(out, want)


def test_a_left_padded_batch_generates_what_each_row_generates_alone():
    model = tiny("llama")
    hf.patch_extension(model, METHODS["selfextend"])
    long, short = ids(1, 70, seed=2), ids(1, 50, seed=3)
    batch = torch.cat((long, torch.cat((torch.zeros(1, 20, dtype=torch.long), short), 1)))
    mask = torch.cat((torch.ones(1, 70), torch.cat((torch.zeros(1, 20), torch.ones(1, 50)), 1)))
    kw = {"max_new_tokens": 30, "do_sample": False, "min_length": 0}
    with torch.no_grad():
        both = model.generate(batch, attention_mask=mask.long(), **kw)
        alone = [model.generate(r, **kw) for r in (long, short)]
    assert torch.equal(both[0], alone[0][0])
    assert torch.equal(both[1, 20:], alone[1][0])


def test_unpatch_restores_bit_identical_logits_and_other_models_never_change():
    model, other = tiny("llama"), tiny("llama")
    x = ids(2, 100)
    with torch.no_grad():
        want, other_want = model(x).logits, other(x).logits
        names = hf.patch_extension(model, METHODS["rerope"])
        assert names == [f"model.layers.{i}.self_attn" for i in range(2)]
        assert not torch.equal(model(x).logits, want)
        assert torch.equal(other(x).logits, other_want)  # the class is untouched
        assert hf.extension_of(model) == METHODS["rerope"] and hf.extension_of(other) is None
        assert hf.unpatch_extension(model) == names
        assert torch.equal(model(x).logits, want)
        assert hf.unpatch_extension(model) == []


def test_a_second_patch_swaps_the_method_in_place_and_a_decode_step_is_the_prefill():
    model = tiny("llama")
    x = ids(1, 90)
    names = hf.patch_extension(model, METHODS["selfextend"])
    with torch.no_grad():
        first = model(x).logits
        assert hf.patch_extension(model, METHODS["leaky"]) == names
        assert hf.extension_of(model) == METHODS["leaky"]
        assert not torch.equal(model(x).logits, first)
        cache = transformers.DynamicCache(config=model.config)
        model(x[:, :80], cache=cache)
        step = model(x[:, 80:], cache=cache).logits
        whole = model(x).logits[:, 80:]
    # The cache's unrotated keys change nothing: the same products, though not always summed in
    # the same order (a 10-row and a 90-row product take different BLAS kernels on some CPUs:
    # bit-equal on the Intel machine this was written on, 2.4e-7 apart on an AMD EPYC), so the
    # float32 row of the table.
    assert_close(step, whole, torch.float32)


def test_a_cache_of_the_patch_is_refused_by_the_plain_model_and_the_reverse():
    model = tiny("llama")
    x = ids(1, 60)
    with torch.no_grad():
        plain_cache = transformers.DynamicCache(config=model.config)
        model(x[:, :50], cache=plain_cache)
        hf.patch_extension(model, METHODS["dca"])
        before = [layer.keys.clone() for layer in plain_cache.layers]
        with pytest.raises(InputError, match="did not write"):
            model(x[:, 50:], cache=plain_cache)
        assert all(torch.equal(a, b.keys) for a, b in zip(before, plain_cache.layers, strict=True))
        cache = transformers.DynamicCache(config=model.config)
        model(x[:, :50], cache=cache)
        hf.unpatch_extension(model)
        with pytest.raises(InputError, match="unrotated keys"):
            model(x[:, 50:], cache=cache)
        # A copied or pickled cache keeps its tag and its positions.
        for again in (copy.deepcopy(cache), pickle.loads(pickle.dumps(cache))):
            with pytest.raises(InputError, match="unrotated keys"):
                model(x[:, 50:], cache=again)
        hf.patch_extension(model, METHODS["dca"])
        step = model(x[:, 50:], cache=pickle.loads(pickle.dumps(cache))).logits
        assert float((step - model(x).logits[:, 50:]).abs().max()) <= 1e-5


def test_a_cropped_cache_goes_on_from_where_it_was_cropped():
    model = tiny("qwen3")
    hf.patch_extension(model, METHODS["selfextend"])
    x = ids(1, 80)
    with torch.no_grad():
        cache = transformers.DynamicCache(config=model.config)
        model(x, cache=cache)
        cache.crop(-10)  # transformers 5: remove the last 10
        step = model(x[:, 70:], cache=cache).logits
        whole = model(x).logits[:, 70:]
    assert float((step - whole).abs().max()) <= 1e-5


def test_the_patched_model_copies_and_pickles_patched():
    model = tiny("llama")
    hf.patch_extension(model, METHODS["rerope"])
    x = ids(1, 80)
    with torch.no_grad():
        want = model(x).logits
        for again in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
            assert hf.extension_of(again) == METHODS["rerope"]
            assert torch.equal(again(x).logits, want)


def test_gemma3_extends_its_global_layers_only():
    model = tiny("gemma3_text")
    names = hf.patch_extension(model, METHODS["selfextend"])
    assert names == ["model.layers.1.self_attn"]


def _state(model) -> dict:
    return {n: (type(m), m.__dict__.get("forward")) for n, m in model.named_modules()}


@pytest.mark.parametrize(
    "make, method, match",
    [
        (lambda: tiny("llama"), "selfextend", "must be posemb.SelfExtend"),
        (
            lambda: transformers.GPT2LMHeadModel(
                transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50)
            ),
            METHODS["rerope"],
            "'gpt2'",
        ),
        (lambda: tiny("llama", num_hidden_layers=1).model.embed_tokens, METHODS["rerope"], "None"),
        (
            lambda: _fused(tiny("llama")),
            METHODS["rerope"],
            "already has its own forward",
        ),
        (
            lambda: tiny("gemma3_text", use_bidirectional_attention=True),
            METHODS["dca"],
            "causal only",
        ),
    ],
    ids=["not-a-method", "not-rope", "no-config", "fused", "dca-bidirectional"],
)
def test_refusals_name_the_cause_and_change_nothing(make, method, match):
    model = make()
    before = _state(model)
    with pytest.raises(InputError, match=match):
        hf.patch_extension(model, method)
    assert _state(model) == before


def _fused(model):
    hf.patch_rotary(model, fused=True)
    return model


def test_bad_calls_in_a_run_are_refused_with_the_cache_unchanged():
    model = tiny("llama")
    hf.patch_extension(model, METHODS["selfextend"])
    x = ids(2, 40)
    with torch.no_grad():
        static = transformers.StaticCache(config=model.config, max_cache_len=64)
        with pytest.raises(InputError, match="needs a DynamicCache"):
            model(x, cache=static)
        cache = transformers.DynamicCache(config=model.config)
        model(x[:, :30], cache=cache)
        held = [layer.keys.clone() for layer in cache.layers]
        with pytest.raises(InputError, match="for 3 sequences, the cache holds 2"):
            model(ids(3, 5), cache=cache)
        assert all(torch.equal(a, b.keys) for a, b in zip(held, cache.layers, strict=True))
        step = model(x[:, 30:], cache=cache).logits  # the run goes on
        assert float((step - model(x).logits[:, 30:]).abs().max()) <= 1e-5
    model.train()
    model.config.attention_dropout = 0.1
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.1
    with pytest.raises(InputError, match="without dropout"):
        model(x)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_the_mask_transformers_builds_is_read_in_each_form(implementation):
    """sdpa passes no mask for an unpadded causal batch and a bool one for a padded batch; eager
    an additive one: the same logits from each."""
    model = tiny("qwen3")
    hf.patch_extension(model, METHODS["dca"])
    x = ids(2, 90)
    mask = torch.ones(2, 90, dtype=torch.long)
    mask[1, :7] = 0
    with torch.no_grad():
        want = [model(x).logits, model(x, attention_mask=mask).logits]
        model.config._attn_implementation = implementation
        got = [model(x).logits, model(x, attention_mask=mask).logits]
    assert torch.equal(got[0], want[0])
    assert torch.equal(got[1][:, 7:], want[1][:, 7:])


def test_sliding_window_layers_keep_their_window_through_generate():
    """Mistral with a sliding window: transformers' sliding cache layer drops old keys; the
    recorded positions follow it."""
    model = tiny("mistral", sliding_window=24)
    hf.patch_extension(model, METHODS["selfextend"])
    prompt = ids(1, 50)
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=40, do_sample=False, min_length=0)
        want = _recompute(model, prompt, out.shape[1] - prompt.shape[1])
    assert torch.equal(out, want)


@pytest.mark.parametrize("how", ["replica", "copy"])
def test_a_copied_or_replicated_extended_attention_runs_its_own_weights(how):
    """Issue 54, bug 10 under patch_extension: the extended forward was bound to the module it
    was made for, so a DataParallel replica computed with the original's projections."""
    eager, patched = tiny("llama"), tiny("llama")
    hf.patch_extension(patched, posemb.SelfExtend(group=4, window=10_000))  # plain RoPE here
    torch.manual_seed(8)
    new = None
    for model in (eager, patched):
        attention = model.model.layers[0].self_attn
        if how == "replica":
            other = attention._replicate_for_data_parallel()
        else:
            other = copy.copy(attention)
            other._modules = dict(other._modules)
        other.q_proj = copy.deepcopy(attention.q_proj)
        new = torch.randn_like(other.q_proj.weight) if new is None else new
        with torch.no_grad():
            other.q_proj.weight.copy_(new)
        model.model.layers[0].self_attn = other
    assert isinstance(patched.model.layers[0].self_attn, hf.extension.ExtendedAttention)
    x = ids(1, 20)
    with torch.no_grad():
        assert float((patched(x).logits - eager(x).logits).abs().max()) <= 1e-5
    with pytest.warns(DeprecationWarning, match="ExtendedAttention"):
        assert hf.extension.ExtendedForward is hf.extension.ExtendedAttention


class _OldExtendedForward:
    """What an earlier posemb kept in an extended attention's __dict__: it pickled as
    ``posemb.hf.extension.ExtendedForward(module, method, rope)``."""

    def __init__(self, module, method, rope):
        self.args = (module, method, rope)

    def __reduce__(self):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return (hf.extension.ExtendedForward, self.args)


def test_a_model_an_earlier_release_pickled_extended_loads_extended():
    patched = tiny("llama")
    hf.patch_extension(patched, METHODS["rerope"])
    x = ids(1, 80)
    with torch.no_grad():
        want = patched(x).logits
    old = tiny("llama")
    for module, now in zip(old.model.layers, patched.model.layers, strict=True):
        method, rope = now.self_attn.posemb_extension
        attention = module.self_attn
        attention.__dict__["forward"] = _OldExtendedForward(attention, method, rope)
    loaded = pickle.loads(pickle.dumps(old))  # the old name resolves to ExtendedAttention
    assert hf.extension_of(loaded) == METHODS["rerope"]
    assert all("forward" not in layer.self_attn.__dict__ for layer in loaded.model.layers)
    with torch.no_grad():
        assert torch.equal(loaded(x).logits, want)
