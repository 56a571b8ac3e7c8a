"""What each trained lab variant puts in each layer: its encoding, window, sinks and temperature.

The 2017-2023 encodings use one encoding in every layer. The 2024-26 ones (the lab's third
edition) are sized here for the lab's model, L = the training length, 4 layers of 4 heads:

- ``p-rope``: p-RoPE (Barbero et al. 2025, "Round and Round We Go! What makes Rotary Positional
  Encodings useful?", ICLR 2025): the fastest fraction p of the pairs rotate, the slowest
  1 - p carry no position (``transformers``' "proportional" rope type, Gemma 4's global
  layers). p = 0.75; the paper trains p = 0.25 and 0.75, and at head_dim 32 the larger p still
  leaves 4 of 16 pairs unrotated.
- ``irope``: Llama 4's interleaving: RoPE in every layer but the last, which has no positions
  (NoPE) and Llama 4's query temperature, 1 + 0.1 ln(1 + floor((p + 1) / L)): Meta's
  floor_scale 8192 with attn_scale 0.1, the floor set to L here, so the factor is 1 at every
  trained position but the last (p = L - 1, where it first steps, as Llama 4's does at
  p = 8,191) and grows by steps past it.
- ``rnope-swa``: RNoPE-SWA (Yang et al. 2025, "Rope to Nope and Back Again: A New Hybrid
  Attention Strategy"; Cohere's ``cohere2`` models): RoPE with a sliding window of L / 2 in
  every layer but the last, which attends globally without positions (Command R7B: windows of
  4,096 in a context trained at 8,192, every fourth layer global).
- ``fope``: FoPE (Hua et al. 2025), :class:`posemb.FourierRotaryEmbedding` with its floor
  frequency at L (at head_dim 32 and L = 64, 5 of 16 pairs are kept) and coefficients per head,
  fixed and drawn as the authors' code draws them (``init="xavier"``, gain 0.3, the gain of
  their smallest model).
- ``cope``: CoPE (Golovneva et al. 2024), :class:`posemb.CoPE`, its table of ``L`` rows: a
  contextual position reaches at most L in a training window (every gate open), so positions
  L - 1 and L share the last row in training and everything longer clamps to it. The authors
  size theirs L + 1 (nothing clamps in training); the difference is one row.
- ``kerple``: KERPLE-log (Chi et al. 2022), :class:`posemb.KerpleBias`, the variant the paper
  finds best.
- ``rope+sinks``: RoPE with a learned sink logit per head in every layer (gpt-oss).
- ``rope+ssmax``: RoPE with scalable softmax in every layer (Nakanishi 2025), s learned per
  head from 0.43.

They are trained, like the encodings before them; the ``rope+`` names say what they add to
RoPE, not that they act at inference.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from .. import scaling as sc
from .._errors import InputError
from ..fope import FourierRotaryEmbedding
from ..temperature import Llama4AttnTemperature, ScalableSoftmax

CLASSIC = ("learned", "sinusoidal", "nope", "alibi", "rope", "t5", "fire", "xpos", "randomized")
RECENT = ("p-rope", "irope", "rnope-swa", "fope", "cope", "kerple", "rope+sinks", "rope+ssmax")
TRAINED = CLASSIC + RECENT

P_ROPE_FRACTION = 0.75
IROPE_ATTN_SCALE = 0.1  # Llama 4's attn_scale (transformers' Llama4TextConfig default)
FOPE_GAIN = 0.3  # the xavier gain of the FoPE authors' smallest model
SSMAX_INIT = 0.43  # SSMax's s in the paper's Figure 1


@dataclass(frozen=True)
class LayerPlan:
    """One layer's attention: a :class:`posemb.PositionalAttention` encoding name, its
    constructor's keyword arguments, and the attention's ``window``, ``sinks`` and query
    temperature (``"ssmax"`` builds a :class:`posemb.temperature.ScalableSoftmax` per layer)."""

    encoding: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    window: int | None = None
    sinks: bool = False
    temperature: Llama4AttnTemperature | str | None = None

    def attention_encoding(self, heads: int, head_dim: int) -> str | nn.Module:
        """The ``encoding`` argument of :class:`posemb.PositionalAttention`: the name, or for
        FoPE the module itself, with one coefficient set per head (a name would share one)."""
        if self.encoding == "fope":
            return FourierRotaryEmbedding(head_dim, num_heads=heads, **self.kwargs)
        return self.encoding

    def attention_kwargs(self, heads: int) -> dict[str, Any]:
        """Keyword arguments for :class:`posemb.PositionalAttention` beyond the encoding."""
        extra: dict[str, Any] = {} if self.encoding == "fope" else dict(self.kwargs)
        if self.window is not None:
            extra["window"] = self.window
        if self.sinks:
            extra["sinks"] = True
        if self.temperature == "ssmax":
            extra["query_temperature"] = ScalableSoftmax(heads, init_s=SSMAX_INIT)
        elif self.temperature is not None:
            extra["query_temperature"] = self.temperature
        return extra


def layer_plans(encoding: str, layers: int, heads: int, train_len: int) -> list[LayerPlan]:
    """Each layer's :class:`LayerPlan` for a model trained with ``encoding``.

    The absolute encodings (learned, sinusoidal) act at the input: their layers are NoPE;
    ``randomized`` trains RoPE on sampled positions (the model draws them).
    """
    if encoding not in TRAINED:
        raise InputError(f"encoding must be one of {', '.join(TRAINED)}, got {encoding!r}")
    last = layers - 1
    if encoding in ("learned", "sinusoidal"):
        return [LayerPlan("nope")] * layers
    if encoding == "randomized":
        return [LayerPlan("rope")] * layers
    if encoding in CLASSIC:
        return [LayerPlan(encoding)] * layers
    if encoding == "p-rope":
        return [LayerPlan("rope", {"scaling": sc.Proportional(P_ROPE_FRACTION)})] * layers
    if encoding in ("irope", "rnope-swa"):
        if layers < 2:
            raise InputError(f"{encoding} needs 2 or more layers (RoPE, then NoPE), got {layers}")
        if encoding == "irope":
            temp = Llama4AttnTemperature(floor_scale=train_len, attn_scale=IROPE_ATTN_SCALE)
            return [LayerPlan("rope")] * last + [LayerPlan("nope", temperature=temp)]
        window = max(1, train_len // 2)
        return [LayerPlan("rope", window=window)] * last + [LayerPlan("nope")]
    if encoding == "fope":
        fope = {"train_len": train_len, "sigma": FOPE_GAIN, "init": "xavier"}
        return [LayerPlan("fope", fope)] * layers
    if encoding == "cope":
        return [LayerPlan("cope", {"max_positions": train_len})] * layers
    if encoding == "kerple":
        return [LayerPlan("kerple", {"kind": "log"})] * layers
    if encoding == "rope+sinks":
        return [LayerPlan("rope", sinks=True)] * layers
    return [LayerPlan("rope", temperature="ssmax")] * layers  # rope+ssmax


__all__ = ["CLASSIC", "RECENT", "TRAINED", "LayerPlan", "layer_plans"]
