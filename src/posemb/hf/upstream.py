"""What the installed ``transformers`` makes of a config: its config class, and the frequencies
of the rotary module its text model builds from it.

posemb reads a config itself (:mod:`posemb.hf.config`); this module asks ``transformers`` for
two things only: a default the file leaves to the model class (``config.py`` does), and
transformers' own reading, to report where it differs from the file (:mod:`posemb.hf.doctor`;
the tests compare with it too). Nothing here imports ``transformers`` at import time.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch

# Frequencies per layer type (None: every layer): (inv_freq as float64, attention factor).
Frequencies = dict[str | None, tuple[torch.Tensor, float]]


@contextlib.contextmanager
def quiet(transformers: Any) -> Iterator[None]:
    """transformers' own validation warnings and log lines silenced (posemb reports what
    matters itself), its verbosity restored after."""
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        transformers.logging.set_verbosity(verbosity)


# Top-level keys of a config.json that no rope formula reads (dtype, quantization, code and
# provenance): never handed to transformers' config class. A bad one (a torch_dtype of 1e308)
# made the class raise IndexError converting it back to a string.
NOT_ROPE_KEYS = frozenset(
    {
        "torch_dtype",
        "dtype",
        "quantization_config",
        "auto_map",
        "architectures",
        "transformers_version",
        "_name_or_path",
    }
)
# The most a rotary module may hold in buffers for posemb to build it (GPT-J's tabulates
# max_position_embeddings x rotary_dim floats: 14 GB at 2^24 positions).
MAX_MODULE_BYTES = 1 << 28


class TooLarge(ValueError):
    """transformers' rotary module would hold more than :data:`MAX_MODULE_BYTES`."""


def one_line(err: BaseException, limit: int = 300) -> str:
    """``"KeyError: ..."``: an error transformers raised, in one line of at most ``limit``."""
    said = " ".join(f"{type(err).__name__}: {err}".split())
    return said if len(said) <= limit else said[: limit - 3] + "..."


class NoConfigClass(ValueError):
    """transformers has no config class for the model type (a model with custom code)."""


def text_config(d: dict[str, object]) -> Any:
    """transformers' text config for a ``config.json`` dict: the model type's config class
    built from the dict (a deep copy), then its decoder text config.

    Raises ``ImportError`` without transformers, ``KeyError``/``ValueError`` (or whatever the
    class raises) for a dict transformers refuses, :class:`NoConfigClass` for a model type it
    has no class for.
    """
    import transformers

    model_type = d.get("model_type")
    if not isinstance(model_type, str) or model_type not in transformers.CONFIG_MAPPING:
        raise NoConfigClass(
            f"transformers {transformers.__version__} has no config class for model_type "
            f"{model_type!r} (a model with custom code, read only with trust_remote_code)"
        )
    kept = {
        k: copy.deepcopy(v) for k, v in d.items() if k != "model_type" and k not in NOT_ROPE_KEYS
    }
    with quiet(transformers):
        cfg = transformers.AutoConfig.for_model(model_type, **kept)
        return cfg.get_text_config(decoder=True)


def rotary_classes(config: Any) -> list[type]:
    """The rotary-embedding classes of the text config's modeling file, the text model's first
    (the config's own name, then names of no other part of the model)."""
    name = type(config).__module__.replace(".configuration_", ".modeling_")
    try:
        module = importlib.import_module(name)
    except ImportError:
        return []
    want = type(config).__name__.replace("Config", "RotaryEmbedding")
    found = [
        c
        for n, c in vars(module).items()
        if isinstance(c, type)
        and n.endswith("RotaryEmbedding")
        and issubclass(c, torch.nn.Module)
        and c.__module__ == module.__name__
    ]
    others = ("Vision", "Audio", "DiT", "Talker", "Token2Wav", "Encoder")
    found.sort(key=lambda c: (c.__name__ != want, any(o in c.__name__ for o in others), c.__name__))
    return found


def frequencies(config: Any) -> tuple[str | None, Frequencies]:
    """``(class name, {layer type or None: (inv_freq, attention factor)})`` of the first rotary
    class of the text model that builds from ``config``; ``(None, {})`` if none does.

    Each class is first built on the meta device (shapes, no memory): one whose tables would
    pass :data:`MAX_MODULE_BYTES` raises :class:`TooLarge` rather than allocate them.

    GPT-J keeps ``cat(sin, cos)`` per position and no ``inv_freq``: the angle at position 1 is
    the frequency (its float32 sin and cos, then atan2 in float64).
    """
    import transformers

    for cls in rotary_classes(config):
        try:
            with quiet(transformers), torch.device("meta"):
                probe = cls(config=config)  # shapes only: nothing is allocated
            size = sum(b.numel() * b.element_size() for b in probe.buffers())
        except Exception:  # a class for another part, or one that reads values while built
            size = 0
        if size > MAX_MODULE_BYTES:
            raise TooLarge(
                f"{cls.__name__} would hold {size / 2**30:.1f} GiB of tables for this config "
                f"(max_position_embeddings {getattr(config, 'max_position_embeddings', '?')})"
            )
        try:
            with quiet(transformers):
                module = cls(config=config)
        except MemoryError:
            raise
        except Exception:  # a rotary class for another part of the model
            continue
        out: Frequencies = {}
        if hasattr(module, "embed_positions"):
            half = module.embed_positions.shape[-1] // 2
            row = module.embed_positions[1].double()
            out[None] = (torch.atan2(row[:half], row[half:]), 1.0)
        if hasattr(module, "inv_freq"):
            out[None] = (module.inv_freq.double(), float(getattr(module, "attention_scaling", 1)))
        for name, buf in module.named_buffers():
            if name.endswith("_inv_freq") and not name.endswith("original_inv_freq"):
                lt = name[: -len("_inv_freq")]
                out[lt] = (buf.double(), float(getattr(module, f"{lt}_attention_scaling", 1)))
        if out:
            return cls.__name__, out
    return None, {}


def rope_parameters(config: Any, layer_type: str | None) -> dict[str, object]:
    """transformers' standardized rope dict for one layer type (its ``rope_parameters``, the
    layer type's entry where it holds one per type); {} where it has none."""
    params = getattr(config, "rope_parameters", None)
    if not isinstance(params, dict):
        return {}
    if layer_type is not None and isinstance(params.get(layer_type), dict):
        return dict(params[layer_type])
    if params and all(isinstance(v, dict) for v in params.values()):
        return {}  # per layer type, and not this one
    return dict(params)
