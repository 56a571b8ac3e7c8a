"""Which modules of a ``transformers`` model posemb touches: one place that decides it.

``patch_rotary`` replaces the text model's rotary modules and, with ``fused=True``, rebinds the
text model's attention; ``unpatch_rotary`` undoes both. Names cannot decide which modules those
are: Pixtral's attention (``PixtralAttention``, in a Mistral 3 vision tower) has no "Vision" in
its class name, and posemb's own ``RotaryEmbedding`` modules inside a patched model end in
"RotaryEmbedding" too. What a module *is* decides:

- **posemb's own** modules (a class defined in posemb) are never candidates and are not
  looked inside, so a second patch finds nothing of posemb's to replace;
- a **transformers rotary module** is a class defined in ``transformers`` whose name ends in
  ``RotaryEmbedding``;
- a module belongs to the **text model** when its own ``config`` is the model's text config
  (``config.get_text_config()``), or a copy of it of the same model type held inside the text
  model (Granite-SWA gives each rotary module its own ``rope_theta``); a module without a
  config belongs where its enclosing module does. A vision tower's modules hold its vision
  config, of another model type.
"""

from __future__ import annotations

from collections.abc import Iterator

from torch import nn


def is_posemb(module: nn.Module) -> bool:
    """Whether ``module`` is one of posemb's (its class is defined in posemb)."""
    return type(module).__module__.split(".")[0] == "posemb"


def is_rotary(module: nn.Module) -> bool:
    """Whether ``module`` is a transformers rotary-embedding module (not posemb's)."""
    cls = type(module)
    return cls.__module__.split(".")[0] == "transformers" and cls.__name__.endswith(
        "RotaryEmbedding"
    )


def _is_config(value: object) -> bool:
    # Duck-typed so that this module does not import transformers: a PretrainedConfig has both.
    return hasattr(value, "to_dict") and hasattr(value, "model_type")


def text_config(model: nn.Module) -> object | None:
    """The model's text config (``config.get_text_config()``), or its config, or None."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def _same(a: object, b: object) -> bool:
    # Identity first; equality for composite models that copy the text config into their
    # language model (``_from_config``).
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # a config whose __eq__ cannot compare: not the same
        return False


def text_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """``(dotted name, module)`` for every module of the text model; posemb's own modules are
    yielded but not looked inside (their ``RotaryEmbedding`` children are not the model's);
    the root (name "") is included."""
    text = text_config(model)
    if text is None:  # not a transformers model: nothing tells a tower apart
        yield from _all_but_inside_posemb(model)
        return
    # Whether each module seen is the text model's, to read the nearest enclosing answer.
    is_text: dict[str, bool] = {}
    for name, module in _all_but_inside_posemb(model):
        own = getattr(module, "config", None)
        parent = name.rpartition(".")[0] if name else None
        while parent is not None and parent not in is_text:
            parent = parent.rpartition(".")[0] if parent else None
        inside = is_text[parent] if parent is not None else False
        if _is_config(own):
            # The text config itself, or (inside the text model) a copy of it that a module
            # was given with its own changes (Granite-SWA's per-layer rope_theta): same model
            # type. A vision tower's config has its own model type.
            same_type = getattr(own, "model_type", None) == getattr(text, "model_type", None)
            is_text[name] = _same(own, text) or (inside and same_type)
        else:
            is_text[name] = inside if name else _same(getattr(model, "config", None), text)
        if is_text[name]:
            yield name, module


def _all_but_inside_posemb(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """Every module, posemb's own yielded but not looked inside."""
    skipped: list[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(s + ".") for s in skipped):
            continue
        if name and is_posemb(module):
            skipped.append(name)
        yield name, module


__all__ = ["is_posemb", "is_rotary", "text_config", "text_modules"]
