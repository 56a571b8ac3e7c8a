"""Fourier Position Embedding (FoPE; Hua et al. 2025, ICML, "Fourier Position Embedding:
Enhancing Attention's Periodic Extension for Length Generalization", arXiv:2412.17739: the
method's two ingredients, cited by content, not by equation number).

RoPE gives pair i of a head one frequency omega_i = base^(-2i/d). FoPE changes two things:

1. Each pair carries a Fourier series instead of a single wave: besides exp(i omega_i m) it gets
   weighted contributions a_omega exp(i omega m) of the other frequencies, with a_omega drawn
   from N(0, sigma^2) (sigma the standard deviation).
2. Frequencies too slow to complete one turn within the training length L,
   omega_i < 2*pi / L (the "floor" frequency), are clipped to zero: those pairs see no position
   (the paper's argument: their periods are never seen whole in training, so they do not
   extrapolate).

In the real form this module computes, for coefficient set g, position m and a kept pair d
(omega_d >= 2*pi/L; with K the kept pairs, k = |K|, the first k since omega decreases):

    C_gd(m) = sum_{j in K} A^cos_{g,j,d} cos(omega_j m)
    S_gd(m) = sum_{j in K} A^sin_{g,j,d} sin(omega_j m)
    (a, b) -> (a C_gd(m) - b S_gd(m),  b C_gd(m) + a S_gd(m)),   and (a, b) -> (a, b) if clipped,

A^cos, A^sin = I + E, E_{g,j,d} ~ N(0, sigma^2): the identity is RoPE's own frequency, E the
other terms. With E = 0 and nothing clipped this is RoPE exactly. C^2 + S^2 is not 1, so unlike
RoPE this is no rotation and the logit is not a function of n - m alone.

What the paper leaves open, as the authors' code (OLMo-based, TsinghuaC3I/Fourier-Position-
Embedding, defaults fourier_separate_basis / separate_head / ignore_zero = True, learnable =
False) settles it, and posemb's choice:

- Separate coefficients for cos and sin (official: yes; posemb: yes).
- One set per head (official: per attention head; InternS1's FoPE: per key/value head).
  posemb: ``num_heads`` sets; head j of a tensor with H heads uses set j // (H / num_heads),
  so in GQA a query head and the key/value head it attends share a set (default 1: shared).
- Fixed or learned (official: fixed, random draws kept as non-trainable parameters; posemb:
  ``learnable=False`` by default; either way they are in the state dict, since the draw is
  part of the model).
- The whole head (official: all head_dim/2 pairs; posemb: the same, no partial rotary).
- The series runs over the kept frequencies only (official ``ignore_zero``; posemb: the same:
  no constant term from a clipped frequency enters a kept pair).
- Initialisation: official adds ``xavier_normal_(gain=sigma)`` to the identity, a std of
  sigma * sqrt(2 / (fan_in + fan_out)) (sigma * sqrt(2 / (k (k + heads))) per head,
  sigma / sqrt(k) shared), not sigma. posemb: std sigma (``init="normal"``), or the official
  rule with ``init="xavier"``.
- Clipped pairs: the paper's omega = 0 gives cos 1, sin 0 (identity). The official code pads
  both tables with 1, so a clipped pair maps (a, b) -> (a - b, b + a), sqrt(2) times a fixed
  45-degree turn (still no position, but its logit terms doubled). posemb: identity (paper).
- Pairs kept: the official OLMo code keeps at most head_dim/4 output pairs (the others padded
  as clipped); with its configs (head_dim 64, L 512) that equals k. posemb: all k kept pairs.
- Boundary: official OLMo keeps omega == 2*pi/L, InternS1 clips it; posemb keeps it (clips <).

Angles are formed in float64 and reduced (:func:`posemb.freqs.angles`), the series summed in
float64, the tables cast once to the compute dtype; outputs take the input dtype.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from . import _checks
from ._errors import InputError
from .freqs import angles, inv_freq
from .kernels.layout import Layout, as_layout, pairs, unpairs

INITS = ("normal", "xavier")


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InputError(f"{name} must be True or False, got {value!r}")
    return value


class FourierRotaryEmbedding(nn.Module):
    """FoPE: RoPE whose pairs carry Fourier series of the kept frequencies (see the module).

    Args:
        head_dim: channels per head of q and k; even (all of them carry position).
        base: frequency base; must exceed 1.
        train_len: the training length L; pairs with omega_i < 2*pi/L are clipped to zero.
        num_heads: coefficient sets (1 shared, or one per query/key-value head group).
        sigma: >= 0, spread of the extra coefficients at initialisation (see ``init``).
        learnable: whether the coefficients train (the official code keeps them fixed).
        layout: which channels form a pair (:class:`posemb.Layout`).
        clip_floor: False keeps every frequency (FoPE without its second ingredient).
        init: "normal" (std sigma, the paper) or "xavier" (the official code's rule).
    """

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        *,
        train_len: int,
        num_heads: int = 1,
        sigma: float = 0.1,
        learnable: bool = False,
        layout: Layout | str = Layout.HALF,
        clip_floor: bool = True,
        init: str = "normal",
    ) -> None:
        super().__init__()
        self._head_dim = _checks.head_width("head_dim", _checks.even_int("head_dim", head_dim))
        self._base = _checks.base(base)
        self._train_len = _checks.positive_int("train_len", train_len)
        self._num_heads = _checks.positive_int("num_heads", num_heads)
        self.sigma = _checks.number("sigma", sigma, minimum=0.0)
        _flag("learnable", learnable)
        self._clip = _flag("clip_floor", clip_floor)
        self.layout = as_layout(layout)
        if init not in INITS:
            raise InputError(f"init must be one of {', '.join(INITS)}, got {init!r}")
        self.init = init
        k = self.kept
        self.cos_coef = nn.Parameter(torch.empty(num_heads, k, k), requires_grad=learnable)
        self.sin_coef = nn.Parameter(torch.empty(num_heads, k, k), requires_grad=learnable)
        self.reset_parameters()

    # Read-only: the coefficient matrices are sized by what these give (the kept pairs).
    head_dim = property(lambda self: self._head_dim, doc="Channels per head.")
    base = property(lambda self: self._base, doc="Frequency base.")
    train_len = property(lambda self: self._train_len, doc="Training length L.")
    num_heads = property(lambda self: self._num_heads, doc="Coefficient sets.")
    clip_floor = property(lambda self: self._clip, doc="Whether slow frequencies are clipped.")

    @property
    def inv_freq(self) -> torch.Tensor:
        """float64 ``(head_dim // 2,)``: omega_i, zero where clipped (omega_i < 2*pi/L)."""
        omega = inv_freq(self.head_dim, self.base, dtype=torch.float64)
        if self.clip_floor:
            omega = torch.where(omega < 2 * math.pi / self.train_len, 0.0, omega)
        return omega

    @property
    def kept(self) -> int:
        """Pairs that keep their frequency (the first ones: omega decreases)."""
        return int((self.inv_freq > 0).sum())

    def reset_parameters(self) -> None:
        """Draw the coefficients afresh: the identity plus noise of spread ``sigma``."""
        with torch.no_grad():
            for coef in (self.cos_coef, self.sin_coef):
                if not coef.numel():
                    continue
                if self.init == "xavier":
                    # The official code's shapes: (heads, k, k) per head, (k, k) when shared.
                    nn.init.xavier_normal_(coef if self.num_heads > 1 else coef[0], self.sigma)
                else:
                    coef.normal_(0.0, self.sigma)
                coef.add_(torch.eye(coef.shape[-1], dtype=coef.dtype, device=coef.device))

    def cos_sin(
        self,
        positions: torch.Tensor,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The series C and S for ``positions``, summed in float64 and cast once to ``dtype``.

        Args:
            positions: integers of shape ``P``, e.g. ``(seq,)`` or ``(batch, seq)``.
            dtype: output dtype.
            device: output device; default that of the coefficients.

        Returns:
            ``(C, S)``, each ``P + (num_heads, head_dim // 2)``; clipped pairs hold 1 and 0.
        """
        _checks.float_dtype("dtype", dtype)
        dev = torch.device(device) if device is not None else self.cos_coef.device
        k, n = self.kept, self.head_dim // 2
        theta = angles(positions, self.inv_freq[:k].to(dev))
        f64, at = torch.float64, theta.device
        # Summed in float64 from float64 angles: a float32 matmul would round each term.
        c = torch.einsum("...j,gjd->...gd", torch.cos(theta), self.cos_coef.to(at, f64))
        s = torch.einsum("...j,gjd->...gd", torch.sin(theta), self.sin_coef.to(at, f64))
        pad = (*c.shape[:-1], n - k)
        c = torch.cat((c, torch.ones(pad, dtype=f64, device=at)), dim=-1)
        s = torch.cat((s, torch.zeros(pad, dtype=f64, device=at)), dim=-1)
        return c.to(dtype=dtype, device=dev), s.to(dtype=dtype, device=dev)

    def _check(self, name: str, x: object) -> torch.Tensor:
        x = _checks.heads_tensor(name, x, self.head_dim)
        if x.shape[1] % self.num_heads:
            raise InputError(
                f"{name} has {x.shape[1]} heads, not a multiple of num_heads={self.num_heads} "
                f"(each coefficient set serves a group of consecutive heads)"
            )
        return x

    def _turn(self, x: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """x ``(batch, heads, seq, head_dim)`` by tables ``(1|batch, num_heads, seq, n)``."""
        compute = _checks.compute_dtype(x)
        c, s = c.to(compute).unsqueeze(2), s.to(compute).unsqueeze(2)
        a, b = (t.unflatten(1, (self.num_heads, -1)) for t in pairs(x.to(compute), self.layout))
        out = unpairs((a * c - b * s).flatten(1, 2), (b * c + a * s).flatten(1, 2), self.layout)
        return out.to(x.dtype)

    def _tables(self, x: torch.Tensor, positions: object) -> tuple[torch.Tensor, torch.Tensor]:
        pos = _checks.positions_for(
            "positions", positions, batch=x.shape[0], length=x.shape[2], device=x.device
        )
        c, s = self.cos_sin(pos, dtype=torch.float64, device=x.device)
        # (seq, g, n) -> (1, g, seq, n); (batch, seq, g, n) -> (batch, g, seq, n)
        c, s = (c.unsqueeze(0), s.unsqueeze(0)) if pos.dim() == 1 else (c, s)
        return c.transpose(1, 2), s.transpose(1, 2)

    def rotate(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Apply FoPE to one tensor ``(batch, heads, seq, head_dim)``; as :meth:`forward`."""
        x = self._check("x", x)
        return self._turn(x, *self._tables(x, positions))

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Apply FoPE to queries and keys that sit at the same positions.

        Args:
            q: ``(batch, q_heads, seq, head_dim)``, q_heads a multiple of ``num_heads``.
            k: ``(batch, kv_heads, seq, head_dim)``, kv_heads a multiple of ``num_heads``
                (GQA: query head j uses set j // (q_heads / num_heads), as its key head does
                when kv_heads = num_heads).
            positions: ``(seq,)`` or ``(batch, seq)`` integers; default ``0 .. seq-1``.

        Returns:
            ``(q, k)``, each with its input's shape and dtype.
        """
        q, k = self._check("q", q), self._check("k", k)
        if k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
            raise InputError(
                f"q and k must share batch and seq (they sit at the same positions), got "
                f"q {tuple(q.shape)} and k {tuple(k.shape)}"
            )
        c, s = self._tables(q, positions)
        return self._turn(q, c, s), self._turn(k, c, s)

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, base={self.base:g}, train_len={self.train_len}, "
            f"num_heads={self.num_heads}, kept={self.kept}, sigma={self.sigma:g}, "
            f"learnable={self.cos_coef.requires_grad}, layout={self.layout.value}, "
            f"clip_floor={self.clip_floor}, init={self.init!r}"
        )


FoPE = FourierRotaryEmbedding

__all__ = ["FoPE", "FourierRotaryEmbedding"]
