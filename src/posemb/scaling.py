"""RoPE scalings: how a rotary embedding picks its frequencies.

posemb calls these objects *scalings* (Hugging Face's ``rope_scaling``), whatever they do to
the frequencies. A scaling maps ``(rotary_dim, base)`` (and, for length-dependent methods, the
current sequence length) to ``(inv_freq, attention_factor)``: the float64 frequencies of the
rotated pairs and a factor that multiplies cos and sin (so every attention logit scales by its
square). This is the contract of Hugging Face's ``ROPE_INIT_FUNCTIONS``, which keeps configs
portable; reading those configs is :mod:`posemb.hf`'s job, never a scaling's.

Scalings are frozen dataclasses validated at construction; they are hashable, so tables can be
memoised on them. Rotation code never sees a scaling, only cos and sin.

Notation: d = rotary_dim, b = base, s = factor, L = the original (pre-training) context length,
theta_i = b^(-2i/d) the default frequencies, lambda_i = 2*pi / theta_i their wavelengths.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from . import _checks
from ._errors import InputError
from .freqs import inv_freq as _default_inv_freq

F64 = torch.float64


def _number(cls: str, name: str, value: object, *, minimum: float, strict: bool = False) -> float:
    return _checks.number(f"{cls}.{name}", value, minimum=minimum, strict=strict)


def _length(cls: str, name: str, value: object) -> int:
    return _checks.positive_int(f"{cls}.{name}", value)


def _need_pairs(cls: str, rotary_dim: int, minimum: int = 2) -> None:
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int) or rotary_dim < minimum:
        raise InputError(f"{cls} needs an even rotary_dim >= {minimum}, got {rotary_dim!r}")
    if rotary_dim % 2:
        raise InputError(f"{cls} needs an even rotary_dim (pairs rotate), got {rotary_dim}")
    _checks.head_width("rotary_dim", rotary_dim)


@dataclass(frozen=True)
class RopeScaling:
    """Base class of all scalings."""

    rope_type: ClassVar[str] = ""
    depends_on_length: ClassVar[bool] = False
    """True when ``compute`` reads ``seq_len``; then ``length_key`` says how."""

    def compute(
        self, rotary_dim: int, base: float, seq_len: int | None = None
    ) -> tuple[torch.Tensor, float]:
        """Return ``(inv_freq, attention_factor)``.

        Args:
            rotary_dim: number of rotated channels; even.
            base: frequency base; must exceed 1.
            seq_len: current sequence length (max position + 1), for length-dependent scalings.

        Returns:
            float64 tensor of shape ``(rotary_dim // 2,)`` and a float.
        """
        raise NotImplementedError

    def length_key(self, seq_len: int | None) -> Hashable:
        """What of ``seq_len`` the result depends on (None: nothing), for memoising tables."""
        return None

    def reuses_tables(self, seq_len: int | None) -> bool:
        """Whether a table of positions formed for a call of length ``seq_len`` can serve other
        calls. False where every length is a schedule of its own (dynamic NTK past its original
        length): a module then rotates the call's positions directly, O(positions) work, rather
        than forming and keeping a table of every position for each decode step."""
        return True

    def bands(self, rotary_dim: int, base: float) -> list[str] | None:
        """Per-frequency band names for methods that treat frequency bands differently."""
        return None


@dataclass(frozen=True)
class Default(RopeScaling):
    """Unscaled RoPE, Su et al. 2021, eq. 15: theta_i = b^(-2i/d)."""

    rope_type: ClassVar[str] = "default"

    def compute(
        self, rotary_dim: int, base: float, seq_len: int | None = None
    ) -> tuple[torch.Tensor, float]:
        _need_pairs("Default", rotary_dim)
        return _default_inv_freq(rotary_dim, base, dtype=F64), 1.0


@dataclass(frozen=True)
class Linear(RopeScaling):
    """Position interpolation, Chen et al. 2023 ("Extending Context Window of Large Language
    Models via Positional Interpolation"), eq. 4: position m is read as m / s, the same as
    theta_i / s for every pair.

    Args:
        factor: the extension ratio s >= 1; ``Linear(1)`` is :class:`Default`.
    """

    rope_type: ClassVar[str] = "linear"
    factor: float

    def __post_init__(self) -> None:
        _number("Linear", "factor", self.factor, minimum=1.0)

    def compute(
        self, rotary_dim: int, base: float, seq_len: int | None = None
    ) -> tuple[torch.Tensor, float]:
        inv, _ = Default().compute(rotary_dim, base)
        return inv / float(self.factor), 1.0


def _ntk_base(base: float, ratio: float, rotary_dim: int) -> float:
    """NTK-aware base change b' = b * ratio^(d / (d - 2)) (bloc97 2023; Peng et al. 2023, eq. 16).

    The exponent makes the slowest pair, i = d/2 - 1, interpolate by exactly ``ratio`` while the
    fastest pair is left alone.
    """
    try:
        new = base * ratio ** (rotary_dim / (rotary_dim - 2))
    except OverflowError:
        new = math.inf
    if not math.isfinite(new):
        # Blame the scaling, not the base the caller gave (which was fine).
        raise InputError(
            f"NTK scaling by {ratio:g} of base {base:g} at rotary_dim {rotary_dim} gives a base "
            f"of {new:g}, beyond float64: choose a smaller factor (or, for dynamic NTK, a "
            f"shorter length)"
        )
    return new


@dataclass(frozen=True)
class NTK(RopeScaling):
    """Static NTK-aware scaling in bloc97's form ("NTK-Aware Scaled RoPE", 2023; Peng et al.
    2023, section 3.1): the base grows to b * s^(d/(d-2)). The fastest pair keeps theta_0 = 1,
    the slowest is divided by exactly s, and the pairs between move geometrically. This is the
    form of x-transformers' and rotary-embedding-torch's ``ntk`` alpha and of dynamic NTK at a
    fixed length. No ``rope_type`` in ``transformers``.

    Not vLLM's ``"ntk"`` rope type, which is a different formula: see :class:`VllmNTK`.

    Args:
        factor: the extension ratio s >= 1.
    """

    rope_type: ClassVar[str] = "ntk"
    factor: float

    def __post_init__(self) -> None:
        _number("NTK", "factor", self.factor, minimum=1.0)

    def compute(
        self, rotary_dim: int, base: float, seq_len: int | None = None
    ) -> tuple[torch.Tensor, float]:
        _need_pairs("NTK", rotary_dim, minimum=4)
        new_base = _ntk_base(base, float(self.factor), rotary_dim)
        return _default_inv_freq(rotary_dim, new_base, dtype=F64), 1.0


@dataclass(frozen=True)
class VllmNTK(RopeScaling):
    """Fixed NTK scaling as vLLM computes its ``rope_scaling`` type ``"ntk"`` (its
    ``NTKScalingRotaryEmbedding`` without ``mixed_b``; Su, kexue.fm/archives/9706):
    theta'_i = (b * s)^(-2i/d) / s^(2/d).

    Against bloc97's :class:`NTK`: the slowest pair is divided by s in both, but here the
    fastest pair is slowed too, by s^(2/d) (1.022 at s = 4, d = 128), and every pair in between
    by a different amount. A config that says ``"type": "ntk"`` (Alibaba's GTE v1.5 encoders
    ship ``{"type": "ntk", "factor": 2.0}``) therefore gives different frequencies in vLLM than in
    code that applies bloc97's base change.

    Args:
        factor: s >= 1.
    """

    rope_type: ClassVar[str] = "vllm_ntk"
    factor: float

    def __post_init__(self) -> None:
        _number("VllmNTK", "factor", self.factor, minimum=1.0)

    def compute(
        self, rotary_dim: int, base: float, seq_len: int | None = None
    ) -> tuple[torch.Tensor, float]:
        _need_pairs("VllmNTK", rotary_dim)
        s = float(self.factor)
        inv = _default_inv_freq(rotary_dim, base * s, dtype=F64)
        return inv / s ** (2.0 / rotary_dim), 1.0


@dataclass(frozen=True)
class DynamicNTK(RopeScaling):
    """Dynamic NTK scaling (emozilla 2023; Peng et al. 2023, section 3.3), as ``transformers``
    computes it: for the current length l' = max(l, L), the base becomes
    b * (s * l' / L - (s - 1))^(d/(d-2)). Up to L it is :class:`Default`; beyond, the base grows
    with the length, so there is no fixed table and no fine-tuning.

    Note that s = 1 is the identity only up to L: past it the base still grows as
    b * (l'/L)^(d/(d-2)); the factor sets the slope, the length sets the scaling.

    posemb recomputes from the length of each call (max position + 1), a pure function.
    ``transformers``' module instead caches the longest length seen and keeps its frequencies for
    later shorter calls that are still above L, so its output depends on call history. vLLM's
    static variant fixes l' = s * L for every length, i.e. ``compute(d, b, seq_len=s * L)``.

    Args:
        factor: s >= 1.
        original_max_position_embeddings: L, the length the model was trained at (transformers
            uses ``max_position_embeddings`` here).
    """

    rope_type: ClassVar[str] = "dynamic"
    depends_on_length: ClassVar[bool] = True
    factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        _number("DynamicNTK", "factor", self.factor, minimum=1.0)
        _length(
            "DynamicNTK", "original_max_position_embeddings", self.original_max_position_embeddings
        )

    def length_key(self, seq_len: int | None) -> Hashable:
        return self._length(seq_len)

    def reuses_tables(self, seq_len: int | None) -> bool:
        # Past L each decode step is a new length, hence a new base: a table for one token.
        return self._length(seq_len) == self.original_max_position_embeddings

    def _length(self, seq_len: int | None) -> int:
        """l' = max(l, L): the length the base is grown for."""
        orig = self.original_max_position_embeddings
        return orig if seq_len is None else max(int(seq_len), orig)

    def compute(
        self, rotary_dim: int, base: float, seq_len: int | None = None
    ) -> tuple[torch.Tensor, float]:
        _need_pairs("DynamicNTK", rotary_dim, minimum=4)
        length = self._length(seq_len)
        s, orig = float(self.factor), self.original_max_position_embeddings
        ratio = s * length / orig - (s - 1)  # transformers' form, for its exact rounding
        if not (math.isfinite(ratio) and ratio > 0.5):
            # Mathematically >= 1 (rounding may leave it a hair below, as in transformers); a
            # factor near float64's range overflows, or cancels to 0.
            raise InputError(
                f"DynamicNTK(factor={s:g}) at length {length} (L = {orig}) gives a base ratio "
                f"of {ratio:g} in float64, where it must be finite and about 1 or more: choose "
                f"a smaller factor"
            )
        new_base = _ntk_base(base, ratio, rotary_dim)
        return _default_inv_freq(rotary_dim, new_base, dtype=F64), 1.0


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature sqrt(1/t) = 0.1 * mscale * ln(s) + 1 (Peng et al. 2023, eq. 22),
    1 for s <= 1."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


@dataclass(frozen=True)
class Yarn(RopeScaling):
    """YaRN, Peng et al. 2023 ("YaRN: Efficient Context Window Extension of Large Language
    Models"), section 3.4: "NTK-by-parts" interpolation plus an attention temperature.

    Pair i turns r_i = L / lambda_i times over the original context. Pairs that turn more than
    beta_fast times keep theta_i (extrapolate), pairs that turn fewer than beta_slow times use
    theta_i / s (interpolate), and a linear ramp in i joins them (eq. 18-19). The ramp's ends are
    the pair indices where r = beta_fast and r = beta_slow, floored and ceiled when ``truncate``.

    The attention factor is ``attention_factor`` if given; else, when both ``mscale`` and
    ``mscale_all_dim`` are given (DeepSeek-V2/V3 configs), yarn_mscale(s, mscale) /
    yarn_mscale(s, mscale_all_dim); else yarn_mscale(s). As in ``transformers``, an ``mscale``
    given without ``mscale_all_dim`` does not enter the factor.

    Args:
        factor: s >= 1.
        original_max_position_embeddings: L.
        beta_fast: turns above which a pair is left alone (paper: 32 for Llama).
        beta_slow: turns below which a pair is fully interpolated (paper: 1).
        mscale: DeepSeek's temperature term (see above).
        mscale_all_dim: its second term (see above).
        attention_factor: explicit factor on cos and sin; > 0.
        truncate: round the ramp's ends to whole pair indices (the paper's code does).
    """

    rope_type: ClassVar[str] = "yarn"
    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True

    def __post_init__(self) -> None:
        _number("Yarn", "factor", self.factor, minimum=1.0)
        _length("Yarn", "original_max_position_embeddings", self.original_max_position_embeddings)
        _number("Yarn", "beta_slow", self.beta_slow, minimum=0.0, strict=True)
        _number("Yarn", "beta_fast", self.beta_fast, minimum=0.0, strict=True)
        # Equal betas are a hard step between kept and interpolated pairs; Kimi K2's published
        # config uses beta_fast = beta_slow = 1.
        if self.beta_fast < self.beta_slow:
            raise InputError(
                f"Yarn.beta_fast must not be less than beta_slow (pairs turning more than "
                f"beta_fast times are kept, fewer than beta_slow interpolated), got beta_fast="
                f"{self.beta_fast!r}, beta_slow={self.beta_slow!r}"
            )
        for name in ("mscale", "mscale_all_dim"):
            if getattr(self, name) is not None:
                _number("Yarn", name, getattr(self, name), minimum=0.0)
        if self.attention_factor is not None:
            _number("Yarn", "attention_factor", self.attention_factor, minimum=0.0, strict=True)
        if not isinstance(self.truncate, bool):
            raise InputError(f"Yarn.truncate must be true or false, got {self.truncate!r}")

    def _ramp(self, rotary_dim: int, base: float) -> torch.Tensor:
        """0 where a pair extrapolates (keeps theta_i), 1 where it interpolates, linear between."""

        def pair_index(turns: float) -> float:
            # Solve L / lambda_i = turns for the pair index i (eq. 17 inverted), as a difference
            # of logs: turns * 2 pi overflowed to inf for a beta of 1e308 (found by fuzzing).
            length = math.log(self.original_max_position_embeddings)
            return (
                rotary_dim
                * (length - math.log(turns) - math.log(2 * math.pi))
                / (2 * math.log(base))
            )

        low, high = pair_index(self.beta_fast), pair_index(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        # The upper clamp is rotary_dim - 1 (not d/2 - 1) in the paper's code and transformers.
        low, high = max(low, 0), min(high, rotary_dim - 1)
        if low == high:
            high += 0.001  # a zero-width ramp would divide by zero; same guard as the reference
        i = torch.arange(rotary_dim // 2, dtype=F64)
        return ((i - low) / (high - low)).clamp(0, 1)

    def effective_attention_factor(self) -> float:
        """The factor on cos and sin (see the class docstring)."""
        if self.attention_factor is not None:
            return float(self.attention_factor)
        s = float(self.factor)
        if self.mscale and self.mscale_all_dim:
            return yarn_mscale(s, self.mscale) / yarn_mscale(s, self.mscale_all_dim)
        return yarn_mscale(s)

    def compute(
        self, rotary_dim: int, base: float, seq_len: int | None = None
    ) -> tuple[torch.Tensor, float]:
        inv, _ = Default().compute(rotary_dim, base)
        ramp = self._ramp(rotary_dim, base)
        return inv / float(self.factor) * ramp + inv * (1 - ramp), self.effective_attention_factor()

    def bands(self, rotary_dim: int, base: float) -> list[str]:
        ramp = self._ramp(rotary_dim, base)
        return [
            "extrapolate" if r == 0 else "interpolate" if r == 1 else "ramp" for r in ramp.tolist()
        ]


@dataclass(frozen=True)
class Llama3(RopeScaling):
    """Llama 3.1's frequency-band scaling (Meta's reference code for Llama 3.1; Grattafiori et
    al. 2024, "The Llama 3 Herd of Models", section 3.4 for the context extension).

    With wavelengths lambda_i, lambda_high = L / high_freq_factor, lambda_low = L / low_freq_factor:
    pairs with lambda_i < lambda_high keep theta_i, pairs with lambda_i > lambda_low use
    theta_i / s, and in between theta_i is blended with weight g = (L / lambda_i - low) /
    (high - low): (1 - g) theta_i / s + g theta_i. Llama 3.1 uses s = 8, low = 1, high = 4,
    L = 8192, b = 500000.

    Args:
        factor: s >= 1.
        low_freq_factor: > 0.
        high_freq_factor: >= low_freq_factor. Equal factors make a hard step with no blended
            band (Llama 4 Scout ships low = high = 1: pairs slower than L are divided by s,
            the rest kept; a pair exactly at lambda = L is kept, where the blend is 0/0).
        original_max_position_embeddings: L.
    """

    rope_type: ClassVar[str] = "llama3"
    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        _number("Llama3", "factor", self.factor, minimum=1.0)
        _number("Llama3", "low_freq_factor", self.low_freq_factor, minimum=0.0, strict=True)
        _number("Llama3", "high_freq_factor", self.high_freq_factor, minimum=0.0, strict=True)
        if self.low_freq_factor > self.high_freq_factor:
            raise InputError(
                f"Llama3.low_freq_factor must not exceed high_freq_factor, got "
                f"low_freq_factor={self.low_freq_factor!r}, "
                f"high_freq_factor={self.high_freq_factor!r}"
            )
        _length("Llama3", "original_max_position_embeddings", self.original_max_position_embeddings)

    def _split(
        self, rotary_dim: int, base: float
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        inv, _ = Default().compute(rotary_dim, base)
        wavelen = 2 * math.pi / inv
        orig = self.original_max_position_embeddings
        high = wavelen < orig / self.high_freq_factor
        low = wavelen > orig / self.low_freq_factor
        return inv, high, low

    def compute(
        self, rotary_dim: int, base: float, seq_len: int | None = None
    ) -> tuple[torch.Tensor, float]:
        inv, high, low = self._split(rotary_dim, base)
        s = float(self.factor)
        if self.low_freq_factor == self.high_freq_factor:
            return torch.where(low, inv / s, inv), 1.0
        g = (self.original_max_position_embeddings * inv / (2 * math.pi) - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        blended = (1 - g) * inv / s + g * inv
        return torch.where(high, inv, torch.where(low, inv / s, blended)), 1.0

    def bands(self, rotary_dim: int, base: float) -> list[str]:
        _, high, low = self._split(rotary_dim, base)
        return [
            "high (kept)" if h else "low (scaled)" if lo else "smoothed"
            for h, lo in zip(high.tolist(), low.tolist(), strict=True)
        ]


def _factors(cls: str, name: str, value: object) -> tuple[float, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise InputError(f"{cls}.{name} must be a list of numbers, got {value!r}")
    return tuple(
        _number(cls, f"{name}[{i}]", v, minimum=0.0, strict=True) for i, v in enumerate(value)
    )


@dataclass(frozen=True)
class LongRope(RopeScaling):
    """LongRoPE, Ding et al. 2024 ("LongRoPE: Extending LLM Context Window Beyond 2 Million
    Tokens"), as Phi-3 ships it: per-pair rescale factors found by search, theta_i / f_i, with
    ``short_factor`` for sequences up to L and ``long_factor`` beyond, and attention factor
    sqrt(1 + ln s / ln L) (s > 1) unless given.

    The switch is per call: once max position + 1 exceeds L, every position of the call uses the
    long factors, as in ``transformers``. A KV cache filled before the switch holds keys rotated
    with the short factors; neither posemb nor transformers re-rotates them.

    Args:
        short_factor: d/2 factors used up to L.
        long_factor: d/2 factors used beyond L.
        original_max_position_embeddings: L.
        factor: s, the extension ratio (Phi-3: max_position_embeddings / L); only sets the
            default attention factor.
        attention_factor: explicit factor on cos and sin.
    """

    rope_type: ClassVar[str] = "longrope"
    depends_on_length: ClassVar[bool] = True
    short_factor: tuple[float, ...]
    long_factor: tuple[float, ...]
    original_max_position_embeddings: int
    factor: float = 1.0
    attention_factor: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "short_factor", _factors("LongRope", "short_factor", self.short_factor)
        )
        object.__setattr__(
            self, "long_factor", _factors("LongRope", "long_factor", self.long_factor)
        )
        if len(self.short_factor) != len(self.long_factor):
            raise InputError(
                f"LongRope.short_factor and long_factor must have the same length (rotary_dim/2), "
                f"got {len(self.short_factor)} and {len(self.long_factor)}"
            )
        _length(
            "LongRope", "original_max_position_embeddings", self.original_max_position_embeddings
        )
        _number("LongRope", "factor", self.factor, minimum=1.0)
        if self.attention_factor is not None:
            _number("LongRope", "attention_factor", self.attention_factor, minimum=0.0, strict=True)
        elif self.factor > 1 and self.original_max_position_embeddings < 2:
            # The default factor divides by ln L: a context of one token has none.
            raise InputError(
                "LongRope.original_max_position_embeddings must be at least 2 for the default "
                f"attention factor sqrt(1 + ln s / ln L), got "
                f"{self.original_max_position_embeddings}; give attention_factor to use L = 1"
            )

    def length_key(self, seq_len: int | None) -> Hashable:
        return seq_len is not None and seq_len > self.original_max_position_embeddings

    def effective_attention_factor(self) -> float:
        """sqrt(1 + ln s / ln L) for s > 1 (Phi-3's choice), or the explicit factor."""
        if self.attention_factor is not None:
            return float(self.attention_factor)
        s = float(self.factor)
        if s <= 1:
            return 1.0
        return math.sqrt(1 + math.log(s) / math.log(self.original_max_position_embeddings))

    def compute(
        self, rotary_dim: int, base: float, seq_len: int | None = None
    ) -> tuple[torch.Tensor, float]:
        inv, _ = Default().compute(rotary_dim, base)
        if len(self.short_factor) != rotary_dim // 2:
            raise InputError(
                f"LongRope.short_factor and long_factor have {len(self.short_factor)} entries; "
                f"rotary_dim {rotary_dim} needs {rotary_dim // 2}"
            )
        chosen = self.long_factor if self.length_key(seq_len) else self.short_factor
        return inv / torch.tensor(chosen, dtype=F64), self.effective_attention_factor()

    def bands(self, rotary_dim: int, base: float) -> list[str]:
        return ["short/long factor"] * (rotary_dim // 2)


@dataclass(frozen=True)
class Proportional(RopeScaling):
    """Proportional RoPE (``transformers`` rope_type "proportional", used by Gemma 4): only the
    first ``int(partial_rotary_factor * d // 2)`` pairs rotate, with frequencies b^(-2i/d) over
    the *whole* head (not over the rotated part, as partial rotary does), and the remaining pairs
    get frequency 0, i.e. pass through. All frequencies are divided by ``factor``.

    Use it with ``rotary_dim == head_dim``: which channels stay still depends on the layout
    (HALF: the tail of each half).

    Args:
        partial_rotary_factor: fraction of pairs that rotate, in [0, 1].
        factor: >= 1, divides all frequencies.
    """

    rope_type: ClassVar[str] = "proportional"
    partial_rotary_factor: float = 1.0
    factor: float = 1.0

    def __post_init__(self) -> None:
        p = _number(
            "Proportional", "partial_rotary_factor", self.partial_rotary_factor, minimum=0.0
        )
        if p > 1:
            raise InputError(
                "Proportional.partial_rotary_factor must be in [0, 1], "
                f"got {self.partial_rotary_factor!r}"
            )
        _number("Proportional", "factor", self.factor, minimum=1.0)

    def compute(
        self, rotary_dim: int, base: float, seq_len: int | None = None
    ) -> tuple[torch.Tensor, float]:
        inv, _ = Default().compute(rotary_dim, base)
        rotating = int(self.partial_rotary_factor * rotary_dim // 2)
        inv[rotating:] = 0.0
        return inv / float(self.factor), 1.0

    def bands(self, rotary_dim: int, base: float) -> list[str]:
        rotating = int(self.partial_rotary_factor * rotary_dim // 2)
        return ["rotates" if i < rotating else "still" for i in range(rotary_dim // 2)]


SCALINGS: dict[str, type[RopeScaling]] = {
    cls.rope_type: cls
    for cls in (Default, Linear, NTK, VllmNTK, DynamicNTK, Yarn, Llama3, LongRope, Proportional)
}


_COMPUTED: collections.OrderedDict[tuple, tuple[torch.Tensor, float]] = collections.OrderedDict()
_COMPUTED_MAX = 256


def cached_compute(
    scaling: RopeScaling,
    rotary_dim: int,
    base: float,
    device: torch.device | str,
    seq_len: int | None = None,
) -> tuple[torch.Tensor, float]:
    """``scaling.compute(rotary_dim, base, seq_len)`` with inv_freq on ``device``, memoised.

    One cache for every module (:class:`~posemb.RotaryEmbedding`,
    :class:`~posemb.MRotaryEmbedding`): its key holds everything the result depends on,
    including what of ``seq_len`` matters (``scaling.length_key``), so an entry is never stale
    and a scaling that ignores the length has one entry per device. Per device, so a GPU forward
    does not copy inv_freq from the host each call. The 256 most recent entries are kept.

    Nothing computed while torch traces is kept (:func:`posemb._checks.tracing`), and every
    call gets its own copy of inv_freq.

    Returns:
        inv_freq ``(rotary_dim / 2,)`` float64 on ``device``, and the attention factor.
    """
    dev = torch.device(device)
    if _checks.tracing():
        # A tensor made while tracing is fake (export, FakeTensorMode) or belongs to a graph:
        # kept, it would be served to every later eager call in the process.
        inv, factor = scaling.compute(rotary_dim, base, seq_len)
        return inv.to(dev), float(factor)
    key = (scaling, rotary_dim, float(base), dev, scaling.length_key(seq_len))
    hit = _COMPUTED.get(key)
    if hit is None:
        with torch.inference_mode(False):  # kept for every later call, training ones too
            inv, factor = scaling.compute(rotary_dim, base, seq_len)
            hit = (inv.to(dev), float(factor))
        _COMPUTED[key] = hit
        if len(_COMPUTED) > _COMPUTED_MAX:
            _COMPUTED.popitem(last=False)
    else:
        _COMPUTED.move_to_end(key)
    # A copy: the entry is shared by every module of this configuration, and a caller that
    # changed the tensor in place would change them all (r/2 numbers, nothing to save).
    return hit[0].clone(), hit[1]


def check(scaling: object) -> RopeScaling:
    """Return ``scaling`` (``None`` means :class:`Default`) if it is a scaling."""
    if scaling is None:
        return Default()
    if not isinstance(scaling, RopeScaling):
        names = ", ".join(cls.__name__ for cls in SCALINGS.values())
        raise InputError(
            f"scaling must be a posemb.scaling object ({names}) or None, "
            f"got {type(scaling).__name__}"
        )
    return scaling


__all__ = [
    "NTK",
    "SCALINGS",
    "Default",
    "DynamicNTK",
    "Linear",
    "Llama3",
    "LongRope",
    "Proportional",
    "RopeScaling",
    "VllmNTK",
    "Yarn",
    "cached_compute",
    "check",
    "yarn_mscale",
]
