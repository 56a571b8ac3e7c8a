"""Every rope type posemb reads from a Hugging Face config, in one table.

A row says which keys of the rope dict the type reads (beyond the common ones), whether it needs
the pre-training context (``original_max_position_embeddings``), and how its keys become a
:mod:`posemb.scaling` object. The key sets are what transformers 5.24's validators accept per
rope type (``modeling_rope_utils.py``, ``RotaryEmbeddingConfigMixin._validate_*``), plus
proportional's ``factor``, which its compute reads.

A row may be **written as** another type: HunYuan's checkpoints say ``"dynamic"`` with a fixed
``alpha``, which transformers' HunYuan modules read as their own ``ntk_alpha`` (a static base
change, not dynamic NTK). Such a row names the model types whose modules read it so.

Adding a rope type is one row here (and its scaling class in :mod:`posemb.scaling` if it is a
new formula).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .. import _checks
from .. import scaling as sc
from .._errors import InputError

COMMON_KEYS = frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor"})


@dataclass
class RopeDict:
    """One rope dict being read: where it is (for messages), its keys, and what the config says
    around it. ``notes`` collects what the reading says to the user."""

    src: str
    p: dict[str, object]
    rope_type: str
    rotary_dim: int
    partial: float
    max_pos: int | None
    original: int
    notes: list[str] = field(default_factory=list)

    def factor(self, required: bool = True, default: float = 1.0) -> float:
        """``factor`` (>= 1); ``default`` when absent and not required."""
        f = self.p.get("factor")
        if f is None:
            if required:
                raise InputError(
                    f"{self.src}['factor'] is missing: rope_type {self.rope_type!r} needs a "
                    f"number >= 1"
                )
            return default
        return _checks.number(f"{self.src}['factor']", f, minimum=1)

    def opt(self, key: str) -> float | None:
        """An optional non-negative number, None when absent or null."""
        v = self.p.get(key)
        return None if v is None else _checks.number(f"{self.src}[{key!r}]", v, minimum=0)

    def need(self, key: str, minimum: float = 0, strict: bool = True) -> float:
        """A number the type cannot do without."""
        if self.p.get(key) is None:
            raise InputError(
                f"{self.src}[{key!r}] is missing: rope_type {self.rope_type!r} needs it"
            )
        return _checks.number(f"{self.src}[{key!r}]", self.p[key], minimum=minimum, strict=strict)


@dataclass(frozen=True)
class RopeType:
    """One rope type: its name, the keys it reads, and how they become a scaling."""

    name: str
    keys: frozenset[str]
    build: Callable[[RopeDict], sc.RopeScaling]
    needs_original: bool = False
    note: str | None = None
    """Said whenever this type is read (vLLM's ``ntk`` is not transformers')."""
    written_as: tuple[str, str] | None = None
    """(rope_type, key): configs write this type as that rope type with that key set."""
    model_types: frozenset[str] | None = None
    """The model types whose modules read it (None: every one)."""

    @property
    def allowed(self) -> frozenset[str]:
        return COMMON_KEYS | self.keys


def _dynamic(r: RopeDict) -> sc.RopeScaling:
    if r.max_pos is None:
        raise InputError("max_position_embeddings is missing: rope_type 'dynamic' scales from it")
    return sc.DynamicNTK(r.factor(), r.max_pos)


def _yarn(r: RopeDict) -> sc.RopeScaling:
    truncate = r.p.get("truncate", True)
    if not isinstance(truncate, bool):
        raise InputError(f"{r.src}['truncate'] must be true or false, got {truncate!r}")
    mscale, mscale_all = r.opt("mscale"), r.opt("mscale_all_dim")
    if r.p.get("attention_factor") is None and bool(mscale) != bool(mscale_all):
        # transformers' _compute_yarn_parameters uses the pair only when both are set (and
        # nonzero); otherwise 0.1 ln(factor) + 1, whatever the one says.
        given, other = ("mscale", "mscale_all_dim") if mscale else ("mscale_all_dim", "mscale")
        r.notes.append(
            f"{given} without {other} changes nothing: the attention factor is 0.1 ln(factor) + 1"
        )
    return sc.Yarn(
        r.factor(),
        r.original,
        # transformers reads a null or 0 beta as its default (32 / 1).
        beta_fast=r.opt("beta_fast") or 32.0,
        beta_slow=r.opt("beta_slow") or 1.0,
        mscale=mscale,
        mscale_all_dim=mscale_all,
        attention_factor=r.opt("attention_factor"),
        truncate=truncate,
    )


def _llama3(r: RopeDict) -> sc.RopeScaling:
    low, high = r.need("low_freq_factor"), r.need("high_freq_factor")
    return sc.Llama3(r.factor(), low, high, r.original)


def _longrope(r: RopeDict) -> sc.RopeScaling:
    lists: dict[str, tuple[float, ...]] = {}
    pairs = r.rotary_dim // 2
    for key in ("short_factor", "long_factor"):
        v = r.p.get(key)
        if not (isinstance(v, list) and len(v) == pairs):
            got = f"{len(v)} entries" if isinstance(v, list) else repr(v)
            raise InputError(
                f"{r.src}[{key!r}] must be a list of rotary_dim/2 = {pairs} numbers, got {got}"
            )
        lists[key] = tuple(
            _checks.number(f"{r.src}[{key!r}][{i}]", x, minimum=0, strict=True)
            for i, x in enumerate(v)
        )
    derived = None if r.max_pos is None else r.max_pos / r.original
    if r.p.get("factor") is None and derived is None:
        raise InputError(
            f"{r.src}['factor'] is missing and max_position_embeddings too: rope_type "
            f"'longrope' needs one of them"
        )
    return sc.LongRope(
        lists["short_factor"],
        lists["long_factor"],
        r.original,
        factor=max(r.factor(required=False, default=derived or 1.0), 1.0),
        attention_factor=r.opt("attention_factor"),
    )


def _ntk_alpha(r: RopeDict) -> sc.RopeScaling:
    # HunYuan's base * alpha^(d/(d-2)) is bloc97's NTK-aware base change with s = alpha, which
    # posemb.scaling.NTK computes; HunYuan ignores the dict's factor.
    return sc.NTK(r.need("alpha", minimum=1))


_YARN_KEYS = {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast"}
_YARN_KEYS |= {"beta_slow", "mscale", "mscale_all_dim", "truncate"}
_LONGROPE_KEYS = {"short_factor", "long_factor", "original_max_position_embeddings"}
_LONGROPE_KEYS |= {"attention_factor", "factor"}
_LLAMA3_KEYS = {"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"}

TABLE: dict[str, RopeType] = {
    t.name: t
    for t in (
        RopeType("default", frozenset(), lambda r: sc.Default()),
        RopeType("linear", frozenset({"factor"}), lambda r: sc.Linear(r.factor())),
        RopeType("dynamic", frozenset({"factor"}), _dynamic),
        RopeType("yarn", frozenset(_YARN_KEYS), _yarn, needs_original=True),
        RopeType("longrope", frozenset(_LONGROPE_KEYS), _longrope, needs_original=True),
        RopeType("llama3", frozenset(_LLAMA3_KEYS), _llama3, needs_original=True),
        RopeType(
            "proportional",
            frozenset({"factor"}),
            lambda r: sc.Proportional(r.partial, r.factor(required=False, default=1.0)),
        ),
        RopeType(
            "ntk",
            frozenset({"factor"}),
            lambda r: sc.VllmNTK(r.factor()),
            note="'ntk' is vLLM's fixed NTK scaling, not a transformers rope type: "
            "posemb.scaling.VllmNTK",
        ),
        RopeType(
            "ntk_alpha",
            # HunYuan's published files also carry factor and YaRN's keys (Hy-MT2: factor 1.0,
            # mscale 1.0), which its module never reads: allowed, not read.
            frozenset({"alpha"} | _YARN_KEYS),
            _ntk_alpha,
            note="'dynamic' with a fixed alpha is HunYuan's static NTK-alpha base change, "
            "theta * alpha^(d/(d-2)) (posemb.scaling.NTK with factor alpha)",
            written_as=("dynamic", "alpha"),
            model_types=frozenset({"hunyuan_v1_dense", "hunyuan_v1_moe"}),
        ),
    )
}
ROPE_TYPES = tuple(TABLE)
ROPE_KEYS: dict[str, frozenset[str]] = {name: t.allowed for name, t in TABLE.items()}


def resolve(rope_type: str, p: dict[str, object], model_type: str | None) -> str:
    """The row a rope dict is read by: ``rope_type`` itself, unless a row is written as it
    (with its key set) for this model type."""
    for t in TABLE.values():
        if (
            t.written_as is not None
            and t.written_as[0] == rope_type
            and p.get(t.written_as[1]) is not None
            and (t.model_types is None or model_type in t.model_types)
        ):
            return t.name
    return rope_type


def read(r: RopeDict) -> sc.RopeScaling:
    """The scaling of one rope dict by its row; every refusal names the dict."""
    try:
        return TABLE[r.rope_type].build(r)
    except InputError as err:
        msg = str(err)
        raise InputError(msg if msg.startswith(r.src) else f"{r.src}: {msg}") from None


__all__ = [
    "COMMON_KEYS",
    "ROPE_KEYS",
    "ROPE_TYPES",
    "TABLE",
    "RopeDict",
    "RopeType",
    "read",
    "resolve",
]
