"""A small decoder-only character LM whose positional scheme is any posemb encoding.

Pre-norm blocks (attention, then a 4x GELU MLP; :class:`Block`, shared with every lab model),
causal attention through :class:`posemb.PositionalAttention`. Absolute encodings are added to
the token embeddings; the others act inside attention. Inference-time RoPE scalings swap the
schedule of a trained RoPE model without touching its weights (:func:`scaling_for`); the
training-free extensions (:data:`EXTENSIONS`) change which distance each pair is rotated by
(:meth:`TinyLM.set_extension`, settings in :mod:`posemb.lab.inference`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from .. import _checks
from .. import scaling as sc
from .._errors import InputError
from ..absolute import LearnedEmbedding, SinusoidalEmbedding
from ..attention import PositionalAttention
from ..bias import RandomizedPositions
from ..extension import Extension, extended_attention
from ..rope import RotaryEmbedding
from .variants import TRAINED, LayerPlan, layer_plans

# Inference-time scalings applied to the trained "rope" model (the trained encodings and what
# each puts in each layer: posemb.lab.variants).
SCALINGS = ("rope+pi", "rope+ntk", "rope+dynamic", "rope+yarn", "rope+llama3")
# Training-free context extensions of the trained "rope" model (issue 33), at inference.
EXTENSIONS = ("rope+selfextend", "rope+rerope", "rope+dca")
VARIANTS = TRAINED + SCALINGS + EXTENSIONS


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the LM; ``max_len`` sizes the learned table and the randomised-position range."""

    vocab: int
    encoding: str
    width: int = 128
    layers: int = 4
    heads: int = 4
    train_len: int = 64
    max_len: int = 1024

    def __post_init__(self) -> None:
        for name in ("vocab", "width", "layers", "heads", "train_len", "max_len"):
            _checks.positive_int(name, getattr(self, name))
        if self.encoding not in TRAINED:
            raise InputError(f"encoding must be one of {', '.join(TRAINED)}, got {self.encoding!r}")
        check_heads(self.width, self.heads)
        if self.max_len < self.train_len:
            raise InputError(
                f"max_len must be >= train_len {self.train_len} (the learned table needs a row "
                f"per trained position), got {self.max_len}"
            )


def check_heads(width: int, heads: int) -> None:
    """Raise ``ValueError`` unless ``width`` splits into ``heads`` heads of even size (RoPE
    rotates channel pairs)."""
    if width % heads or (width // heads) % 2:
        raise InputError(f"width {width} must split into {heads} heads of even size")


class Block(nn.Module):
    """Pre-norm transformer block: ``x + proj(attention(norm1 x))``, then ``x + mlp(norm2 x)``.

    Every lab model stacks these: the character LM (causal) and the dog-bites-man encoder
    (bidirectional). ``forward(x (b, s, width), positions=None) -> (b, s, width)``; positions
    ``(s,)`` or ``(b, s)`` serve both queries and keys (self-attention). ``plan`` (a
    :class:`posemb.lab.variants.LayerPlan`) adds a window, sinks, a query temperature or the
    encoding's settings; without one the attention is ``encoding``'s with its defaults.
    """

    def __init__(
        self, width: int, heads: int, encoding: str, causal: bool, plan: LayerPlan | None = None
    ) -> None:
        super().__init__()
        check_heads(width, heads)
        self.heads = heads
        # Multiplies the queries, so every content logit q.k (not an added bias): the lab's
        # attention temperature (see TinyLM.set_logit_scale). A plain float: not in checkpoints.
        self.logit_scale = 1.0
        # A training-free extension to attend under (RoPE blocks only; TinyLM.set_extension).
        self.extension: Extension | None = None
        # Registration order fixes the order of initialisation draws and of parameters():
        # kept as it was so that seeded runs give the same numbers.
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        enc: str | nn.Module = encoding
        extra = {}
        if plan is not None:
            enc, extra = (
                plan.attention_encoding(heads, width // heads),
                plan.attention_kwargs(heads),
            )
        self.attn = PositionalAttention(
            enc, num_heads=heads, head_dim=width // heads, causal=causal, **extra
        )
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, s, w = x.shape
        qkv = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, w // self.heads)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # (b, h, s, d) each
        if self.logit_scale != 1.0:
            q = q * self.logit_scale
        return q, k, v

    def attention_weights(
        self, x: torch.Tensor, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The attention probabilities of this block on ``x`` ``(b, s, width)``:
        ``(b, heads, s, s)``, as :meth:`forward` uses them."""
        if self.extension is not None:
            raise InputError("attention_weights are not formed under an extension")
        q, k, _ = self._qkv(x)
        return self.attn.attention_weights(q, k, positions=positions, k_positions=positions)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        b, s, w = x.shape
        q, k, v = self._qkv(x)
        if self.extension is None:
            a = self.attn(q, k, v, positions=positions, k_positions=positions)
        else:
            rope = self.attn.encoding
            assert isinstance(rope, RotaryEmbedding)  # set_extension checked it
            causal = self.attn.causal
            a = extended_attention(q, k, v, rope, self.extension, positions, positions, causal)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, w))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    """Character LM: ``forward(tokens (b, s), positions=None) -> logits (b, s, vocab)``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.width)
        self.input_pos: nn.Module | None = None
        if cfg.encoding == "learned":
            # Rows past train_len exist but are never trained: evaluating there is labelled so.
            self.input_pos = LearnedEmbedding(cfg.max_len, cfg.width)
        elif cfg.encoding == "sinusoidal":
            self.input_pos = SinusoidalEmbedding(cfg.width)
        self.randomized = RandomizedPositions(cfg.max_len) if cfg.encoding == "randomized" else None
        # Where training draws randomised positions from: a job sets its own (and saves its
        # state with the checkpoint) so that a resumed run draws what an unbroken one would;
        # None draws from torch's global generator.
        self.position_generator: torch.Generator | None = None
        # (rank, world) of data-parallel training: every rank draws the whole batch's positions
        # from the same generator and keeps its rows, as it does with the data, so that one
        # saved generator state resumes every rank and the run matches one process exactly.
        self.position_shard: tuple[int, int] = (0, 1)
        plans = layer_plans(cfg.encoding, cfg.layers, cfg.heads, cfg.train_len)
        self.blocks = nn.ModuleList(
            Block(cfg.width, cfg.heads, p.encoding, causal=True, plan=p) for p in plans
        )
        self.norm = nn.LayerNorm(cfg.width)
        self.out = nn.Linear(cfg.width, cfg.vocab)
        # What set_scaling(None) restores: the schedules the variant trains with.
        self._own_scalings = [r.scaling for r in self.rotary_modules()]

    def rotary_modules(self) -> list[RotaryEmbedding]:
        """The RoPE modules of every layer (empty for other encodings)."""
        encodings = [b.attn.encoding for b in self.blocks if isinstance(b, Block)]
        return [e for e in encodings if isinstance(e, RotaryEmbedding)]

    def set_scaling(self, scaling: sc.RopeScaling | None) -> None:
        """Use another RoPE schedule at inference (position interpolation, NTK, YaRN, ...); None
        gives each rotary module back the schedule it was built with (p-RoPE keeps its own)."""
        ropes = self.rotary_modules()
        own = getattr(self, "_own_scalings", None) or [r.scaling for r in ropes]
        for rope, trained in zip(ropes, own, strict=True):
            rope.scaling = trained if scaling is None else sc.check(scaling)

    def set_extension(self, method: Extension | None) -> None:
        """Attend under a training-free extension (:class:`posemb.SelfExtend`, ReRoPE,
        DualChunk) in every layer, or plainly again with None. RoPE models only."""
        if method is not None:
            plain = [
                isinstance(b.attn.encoding, RotaryEmbedding)
                and b.attn.sinks is None
                and b.attn.query_temperature is None
                and b.attn.window is None
                for b in self.blocks
                if isinstance(b, Block)
            ]
            if not all(plain):
                # extended_attention is RoPE attention alone: a NoPE layer, sinks, a temperature
                # or a window would be dropped without a word.
                raise InputError(
                    f"an extension re-maps the distances of plain RoPE attention in every layer; "
                    f"this model is {self.cfg.encoding!r}"
                )
        for blk in self.blocks:
            if isinstance(blk, Block):
                blk.extension = method

    def set_logit_scale(self, scale: float) -> None:
        """Multiply every attention logit's content term q.k by ``scale`` in every layer.

        YaRN's attention factor f multiplies cos and sin, so both q and k: its logits are
        ``f**2 q.k``, which ``set_logit_scale(f**2)`` reproduces for any encoding (for an added
        bias such as ALiBi's only the content term is scaled). 1.0 switches it off.
        """
        _checks.number("logit_scale", scale, minimum=0.0, strict=True)
        for blk in self.blocks:
            if isinstance(blk, Block):
                blk.logit_scale = float(scale)

    def input_embeddings(
        self, tokens: torch.Tensor, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Token embeddings plus the absolute encoding, if any: ``(b, s) -> (b, s, width)``."""
        x = self.embed(tokens)
        if self.input_pos is not None:
            x = self.input_pos(x, positions)
        return x

    def attention_weights(self, tokens: torch.Tensor) -> list[torch.Tensor]:
        """Each layer's attention probabilities on ``tokens`` ``(b, s)`` in eval mode:
        a list of ``layers`` tensors ``(b, heads, s, s)``."""
        return list(self.iter_attention_weights(tokens))

    def iter_attention_weights(self, tokens: torch.Tensor) -> Iterator[torch.Tensor]:
        """:meth:`attention_weights` one layer at a time, so that a caller reducing each
        ``(b, heads, s, s)`` holds one layer's (at 8192 tokens, 8 heads: 2 GiB a window)."""
        x = self.input_embeddings(tokens)
        for blk in self.blocks:
            if isinstance(blk, Block):
                yield blk.attention_weights(x)
                x = blk(x)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        b, s = tokens.shape
        if positions is None and self.randomized is not None and self.training:
            rank, world = self.position_shard
            every = self.randomized(b * world, s, tokens.device, self.position_generator)
            positions = every[rank * b : (rank + 1) * b]
        x = self.input_embeddings(tokens, positions)  # (b, s, width)
        for blk in self.blocks:
            x = blk(x, positions)
        return self.out(self.norm(x))


def yarn_turns(train_len: int) -> tuple[float, float]:
    """YaRN's (beta_fast, beta_slow) for a model trained at ``train_len`` tokens.

    Peng et al. tuned beta_fast = 32, beta_slow = 1 (turns over the original context) for Llama
    at 4096 tokens, where the fastest pair turns ~650 times. At 64 tokens it turns ~10 times, so
    32 would leave no pair unscaled; a pilot at 64 tokens found 4 and 0.5 good. posemb joins the
    two points: beta_fast = min(32, L / 16), beta_slow = min(1, L / 128).
    """
    return min(32.0, train_len / 16), min(1.0, train_len / 128)


def scaling_for(variant: str, train_len: int, eval_len: int) -> sc.RopeScaling:
    """The inference-time schedule of a ``rope+...`` variant at one evaluation length.

    PI, NTK, YaRN and Llama 3 take s = eval_len / train_len (never below 1); dynamic NTK takes
    factor 1 and grows its base with each call's length, which is NTK at s = length / train_len.
    Llama 3 keeps Llama 3.1's band edges relative to the original length (low_freq_factor 1,
    high_freq_factor 4): pairs turning fewer than once over train_len are divided by s, pairs
    turning more than 4 times kept.
    """
    s = max(1.0, eval_len / train_len)
    if variant == "rope+pi":
        return sc.Linear(s)
    if variant == "rope+ntk":
        return sc.NTK(s)
    if variant == "rope+dynamic":
        return sc.DynamicNTK(1.0, train_len)
    if variant == "rope+yarn":
        fast, slow = yarn_turns(train_len)
        return sc.Yarn(s, train_len, beta_fast=fast, beta_slow=slow)
    if variant == "rope+llama3":
        return sc.Llama3(s, 1.0, 4.0, train_len)
    raise InputError(f"unknown scaling variant {variant!r}; known: {', '.join(SCALINGS)}")
