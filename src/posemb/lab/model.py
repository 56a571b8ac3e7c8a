"""A small decoder-only character LM whose positional scheme is any posemb encoding.

Pre-norm blocks (attention, then a 4x GELU MLP), causal attention through
:class:`posemb.PositionalAttention`. Absolute encodings are added to the token embeddings;
the others act inside attention. Inference-time RoPE scalings swap the schedule of a trained
RoPE model without touching its weights (:func:`scaling_for`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .. import scaling as sc
from ..absolute import LearnedEmbedding, SinusoidalEmbedding
from ..attention import PositionalAttention
from ..bias import RandomizedPositions
from ..rope import RotaryEmbedding

# Encodings a model is trained with, and inference-time scalings applied to the "rope" model.
TRAINED = ("learned", "sinusoidal", "nope", "alibi", "rope", "t5", "fire", "xpos", "randomized")
SCALINGS = ("rope+pi", "rope+ntk", "rope+dynamic", "rope+yarn")
VARIANTS = TRAINED + SCALINGS


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


class TinyLM(nn.Module):
    """Character LM: ``forward(tokens (b, s), positions=None) -> logits (b, s, vocab)``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.encoding not in TRAINED:
            raise ValueError(f"unknown encoding {cfg.encoding!r}; known: {', '.join(TRAINED)}")
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.width)
        self.input_pos: nn.Module | None = None
        attn_enc = cfg.encoding
        if cfg.encoding == "learned":
            # Rows past train_len exist but are never trained: evaluating there is labelled so.
            self.input_pos, attn_enc = LearnedEmbedding(cfg.max_len, cfg.width), "nope"
        elif cfg.encoding == "sinusoidal":
            self.input_pos, attn_enc = SinusoidalEmbedding(cfg.width), "nope"
        self.randomized = RandomizedPositions(cfg.max_len) if cfg.encoding == "randomized" else None
        if cfg.encoding == "randomized":
            attn_enc = "rope"
        head_dim = cfg.width // cfg.heads
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                {
                    "norm1": nn.LayerNorm(cfg.width),
                    "qkv": nn.Linear(cfg.width, 3 * cfg.width),
                    "attn": PositionalAttention(
                        attn_enc, num_heads=cfg.heads, head_dim=head_dim, causal=True
                    ),
                    "proj": nn.Linear(cfg.width, cfg.width),
                    "norm2": nn.LayerNorm(cfg.width),
                    "mlp": nn.Sequential(
                        nn.Linear(cfg.width, 4 * cfg.width),
                        nn.GELU(),
                        nn.Linear(4 * cfg.width, cfg.width),
                    ),
                }
            )
            for _ in range(cfg.layers)
        )
        self.norm = nn.LayerNorm(cfg.width)
        self.out = nn.Linear(cfg.width, cfg.vocab)

    def rotary_modules(self) -> list[RotaryEmbedding]:
        """The RoPE modules of every layer (empty for other encodings)."""
        return [
            b["attn"].encoding
            for b in self.blocks
            if isinstance(b["attn"].encoding, RotaryEmbedding)
        ]

    def set_scaling(self, scaling: sc.RopeScaling | None) -> None:
        """Use another RoPE schedule at inference (position interpolation, NTK, YaRN, ...)."""
        for rope in self.rotary_modules():
            rope.scaling = sc.check(scaling)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        b, s = tokens.shape
        if positions is None and self.randomized is not None and self.training:
            positions = self.randomized(b, s, tokens.device)
        x = self.embed(tokens)  # (b, s, width)
        if self.input_pos is not None:
            x = self.input_pos(x, positions)
        heads, w = self.cfg.heads, self.cfg.width
        for blk in self.blocks:
            qkv = blk["qkv"](blk["norm1"](x)).view(b, s, 3, heads, w // heads)
            q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # (b, h, s, d)
            a = blk["attn"](q, k, v, positions=positions, k_positions=positions)
            x = x + blk["proj"](a.transpose(1, 2).reshape(b, s, w))
            x = x + blk["mlp"](blk["norm2"](x))
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

    PI, NTK and YaRN take s = eval_len / train_len (never below 1); dynamic NTK takes factor 1
    and grows its base with each call's length, which is NTK at s = length / train_len.
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
    raise ValueError(f"unknown scaling variant {variant!r}; known: {', '.join(SCALINGS)}")
