"""posemb's fused rotation inside ``transformers`` attention: ``patch_rotary(model, fused=True)``.

transformers' attention modules call ``apply_rotary_pos_emb(q, k, cos, sin)`` by its module-global
name at call time, and the eager function makes several passes with four temporaries
(``q * cos + rotate_half(q) * sin``). Replacing that global would patch every model of the
family in the process, and transformers' own hooks (``use_kernel_forward_from_hub``,
``transformers.monkey_patching``) are process-wide too (and inert without the ``kernels``
package). So posemb swaps each attention *instance* of one model into a subclass of its own
class (:class:`FusedAttention`) whose ``forward`` is a copy of the class's function that calls
posemb's rotation instead, and sees every other global of the modeling module as it is at the
call (:mod:`posemb.hf.rebind`); :func:`unpatch_fused` gives each instance its class back, and
the class itself is never touched.

Only families whose rotation posemb expresses are fused (:data:`FORMS`), each checked
numerically against the family's own function when patched (a mismatch refuses, it never runs
silently eager or wrong): ``rotate_half`` on ``cat([c, c])`` tables, partial rotary by the
tables' width (Llama, Qwen2, Mistral, Gemma 3, OLMo 3, Phi-3, GPT-NeoX and the rest of that
form), Cohere's rotation of interleaved pairs on ``repeat_interleave``'d tables, and Llama 4's
complex ``freqs_cis`` on interleaved pairs of (batch, seq, heads, head_dim) tensors and
DeepSeek-V2's on (batch, heads, seq, head_dim), and
DeepSeek-V3's ``apply_rotary_pos_emb_interleave`` (pairs de-interleaved into rotate_half
order). An attention calling any rotation posemb does not express is refused: it would stay
eager while the model claimed to be fused.

Nothing here is cached by a tensor's identity, data pointer or version counter: the rotations
read their tables and the norms' weights at each call
(:class:`posemb.kernels.fast.DerivedRotation`), forms are probed once per patch, and the renamed
code is keyed on the class's code object (:mod:`posemb.hf.rebind`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .. import _checks, _renamed, kernels
from .._errors import InputError
from ..kernels.layout import Layout
from . import rebind
from .fused_norm import (
    NORM_ROTATION,
    DeferredNorm,
    NormSpec,
    begin,
    defer,
    end,
    restore,
    why_not,
)

logger = logging.getLogger("posemb.hf")

ROTATION = "apply_rotary_pos_emb"
_MARK = "_posemb_fused"


def fused_rotation(
    layout: Layout, halved_tables: bool = False
) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """A drop-in ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` through posemb's op.

    Args:
        layout: ``Layout.HALF`` for ``rotate_half`` on ``cat([c, c])`` tables,
            ``Layout.INTERLEAVED`` for pairs (2j, 2j+1) on ``repeat_interleave(c, 2)`` tables.
        halved_tables: the tables are one entry per pair, ``(B, S, r/2)`` (gpt-oss), not
            repeated to the rotary width.

    Returns:
        The function: q ``(B, Hq, S, D)`` and k ``(B, Hk, S, D)`` (or ``(B, S, H, D)`` with
        ``unsqueeze_dim=2``), cos and sin ``(B, S, r)`` with r <= D (partial rotary rotates
        the first r channels); returns ``(q', k')`` in q's dtype.
    """

    def apply_rotary_pos_emb(
        q: torch.Tensor,
        k: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        unsqueeze_dim: int = 1,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # transformers 5.x's signature exactly: a caller passing unsqueeze_dim by position
        # must not have it read as 4.x's position_ids.
        if unsqueeze_dim == 2:  # (B, S, H, D): rotate (B, H, S, D) views
            qr, kr = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
            return qr.transpose(1, 2), kr.transpose(1, 2)
        if unsqueeze_dim != 1:
            raise InputError(f"unsqueeze_dim must be 1 or 2, got {unsqueeze_dim}")
        # Every layer of a step gets the same two tensors: their op-ready halves are cut
        # once per step, not once per layer.
        out = derived(q, k, cos, sin)
        if out is not None:
            return out
        return kernels.rotate(q, k, cut(cos), cut(sin), layout=layout)

    def cut(t: torch.Tensor) -> torch.Tensor:
        if halved_tables:
            return t
        if layout is Layout.HALF:
            return t[..., : t.shape[-1] // 2]
        return t[..., ::2]

    form = 0 if halved_tables else 1 if layout is Layout.HALF else 2
    derived = kernels.fast.DerivedRotation(form, layout is Layout.INTERLEAVED)

    apply_rotary_pos_emb.__doc__ = f"posemb's fused rotation ({layout.value} pairs)."
    return apply_rotary_pos_emb


def fused_deinterleaving_rotation() -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """A drop-in ``apply_rotary_pos_emb_interleave(q, k, cos, sin, position_ids=None,
    unsqueeze_dim=1)`` (DeepSeek-V3's ``rope_interleave``) through posemb's op.

    DeepSeek's checkpoints hold each pair (2j, 2j+1) side by side, and transformers returns the
    rotated pairs de-interleaved, in ``rotate_half`` order (the order its KV cache keeps). So
    this de-interleaves q and k (one copy each) and rotates that in one fused pass, returning
    exactly the layout transformers returns.

    Returns:
        The function: q ``(B, Hq, S, r)``, k ``(B, Hk, S, r)``, cos and sin ``(B, S, r)`` in
        ``cat([c, c])`` form; returns ``(q', k')`` in rotate_half order, in q's dtype.
    """
    half = fused_rotation(Layout.HALF)

    def apply_rotary_pos_emb_interleave(
        q: torch.Tensor,
        k: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        unsqueeze_dim: int = 1,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        def deinterleave(x: torch.Tensor) -> torch.Tensor:
            return x.unflatten(-1, (-1, 2)).transpose(-1, -2).flatten(-2)

        return half(deinterleave(q), deinterleave(k), cos, sin, unsqueeze_dim)

    return apply_rotary_pos_emb_interleave


def fused_complex_rotation(bshd: bool = True) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """A drop-in ``apply_rotary_emb(xq, xk, freqs_cis)`` (Llama 4, DeepSeek-V2) through
    posemb's op.

    Args:
        bshd: q and k are ``(B, S, H, D)`` (Llama 4); False for ``(B, H, S, D)`` (DeepSeek-V2).

    Returns:
        The function: xq and xk with pairs (2j, 2j+1), ``(B, S, H, D)`` or ``(B, H, S, D)``,
        freqs_cis complex ``(B, S, D/2)`` (its modulus, the attention factor, scales both);
        returns the rotated ``(xq', xk')`` in their dtypes.
    """

    def apply_rotary_emb(
        xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        c, s = freqs_cis.real.float(), freqs_cis.imag.float()
        if not bshd:
            return kernels.rotate(xq, xk, c, s, layout=Layout.INTERLEAVED)
        qr, kr = kernels.rotate(
            xq.transpose(1, 2), xk.transpose(1, 2), c, s, layout=Layout.INTERLEAVED
        )
        return qr.transpose(1, 2), kr.transpose(1, 2)

    return apply_rotary_emb


@dataclasses.dataclass(frozen=True)
class _Form:
    """One rotation form posemb fuses: the module-global name the attention calls, posemb's
    replacement, and a probe input in that form (q, k and the tables, head_dim and rotary)."""

    name: str
    label: str
    replacement: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    probe: Callable[[int, int], tuple[torch.Tensor, ...]]


def _probe_angles(rotary: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    angles = torch.rand(2, 5, rotary // 2, generator=g, dtype=torch.float64) * 6.0
    return angles.cos().float(), angles.sin().float()


def _probe_qk(head_dim: int, bshd: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 3, 5, head_dim, generator=g), torch.randn(2, 1, 5, head_dim, generator=g)
    return (q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()) if bshd else (q, k)


def _probe_half(head_dim: int, rotary: int) -> tuple[torch.Tensor, ...]:
    c, s = _probe_angles(rotary)
    return (*_probe_qk(head_dim), torch.cat((c, c), -1), torch.cat((s, s), -1))


def _probe_halved(head_dim: int, rotary: int) -> tuple[torch.Tensor, ...]:
    return (*_probe_qk(head_dim), *_probe_angles(rotary))


def _probe_interleaved(head_dim: int, rotary: int) -> tuple[torch.Tensor, ...]:
    c, s = _probe_angles(rotary)
    return (*_probe_qk(head_dim), c.repeat_interleave(2, -1), s.repeat_interleave(2, -1))


def _probe_complex(head_dim: int, rotary: int, bshd: bool = True) -> tuple[torch.Tensor, ...]:
    c, s = _probe_angles(rotary)
    return (*_probe_qk(head_dim, bshd=bshd), torch.complex(c, s) * 0.9)


def _probe_complex_bhsd(head_dim: int, rotary: int) -> tuple[torch.Tensor, ...]:
    return _probe_complex(head_dim, rotary, bshd=False)


FORMS = (
    _Form(ROTATION, "rotate_half on cat([cos, cos])", fused_rotation(Layout.HALF), _probe_half),
    _Form(
        ROTATION,
        "rotate_half on one table entry per pair",
        fused_rotation(Layout.HALF, halved_tables=True),
        _probe_halved,
    ),
    _Form(
        ROTATION,
        "pairs (2j, 2j+1) on repeated tables",
        fused_rotation(Layout.INTERLEAVED),
        _probe_interleaved,
    ),
    _Form(
        "apply_rotary_emb",
        "complex freqs_cis on pairs, (batch, seq, heads, dim)",
        fused_complex_rotation(),
        _probe_complex,
    ),
    _Form(
        "apply_rotary_emb",
        "complex freqs_cis on pairs, (batch, heads, seq, dim)",
        fused_complex_rotation(bshd=False),
        _probe_complex_bhsd,
    ),
    _Form(
        "apply_rotary_pos_emb_interleave",
        "pairs (2j, 2j+1) returned in rotate_half order, on cat([cos, cos])",
        fused_deinterleaving_rotation(),
        _probe_half,
    ),
)
NAMES = tuple(dict.fromkeys(f.name for f in FORMS))


def _innermost(fn: Any) -> Any:
    while getattr(fn, "__wrapped__", None) is not None:
        fn = fn.__wrapped__
    return fn


def _agrees(original: Callable[..., Any], form: _Form, head_dim: int, rotary: int) -> bool:
    """Does posemb's rotation give the family's own function's result on a probe input?

    The probe's q and k are the full head first, then cut to the rotary width: a family that
    rotates part of the head may pass the whole head (Llama-style partial rotary) or split off
    the rotated part first (Phi-1). The form agrees if the family's function runs on one of them
    and posemb's gives its result on each it runs on."""
    ran = False
    for width in dict.fromkeys((head_dim, rotary)):
        args = form.probe(width, rotary)
        with torch.no_grad():
            try:
                want = original(*args)
            except Exception:  # another signature or width (DeepSeek-V4 rotates one tensor)
                continue
            got = form.replacement(*args)
        ran = True
        if not all(
            bool(torch.allclose(a, b, rtol=1e-5, atol=1e-5)) for a, b in zip(got, want, strict=True)
        ):
            return False
    return ran


def _form_of(modeling: str, name: str, head_dim: int, rotary: int) -> _Form:
    original = getattr(sys.modules[modeling], name)
    for form in FORMS:
        if form.name == name and _agrees(original, form, head_dim, rotary):
            return form
    labels = "; ".join(f.label for f in FORMS if f.name == name)
    raise InputError(
        f"{modeling}.{name} is none of the forms posemb fuses ({labels}); posemb does not fuse "
        f"it (patch_rotary without fused=True swaps the tables only)"
    )


class FusedAttention(rebind.Swapped):
    """The class of an attention module :func:`patch_fused` fused: a subclass of the module's
    own class and of this one (same name, module and qualified name; the class itself is never
    touched) whose ``forward`` is the class's with posemb's rotation in place of the family's,
    and, where the norms are fused too, the q and k norms handed to it (:mod:`.fused_norm`).

    A shallow copy, a deep copy, an ``nn.DataParallel`` replica and a pickled model loaded
    again keep the class, and each computes with its own weights (issue 54: a forward bound to
    the original module ran the original's projections in every copy). ``isinstance(module,
    FusedAttention)`` tells a fused module; :func:`is_fused` also sees one beneath an
    accelerate hook.
    """

    _posemb_forms: tuple[_Form, ...]
    _posemb_normed: bool

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A model pickled by an earlier posemb held its fused forward in the instance's
        # __dict__ (see _fused_again): the class's forward serves it now.
        super().__setstate__(state)  # type: ignore[misc]
        if self.__dict__.get("forward") is _REPLACED:
            del self.__dict__["forward"]
        if self.__dict__.get("_old_forward") is _REPLACED:
            cls: Any = type(self)
            self.__dict__["_old_forward"] = types.MethodType(cls.forward, self)


_fused_classes: dict[tuple[type, tuple[int, ...], bool], type] = {}


def fused_class(base: Any, forms: tuple[int, ...], normed: bool = False) -> type:
    """The :class:`FusedAttention` subclass of attention class ``base`` that fuses the rotation
    forms ``FORMS[i] for i in forms`` (and the q and k norms where ``normed``); one per
    arguments in a process."""
    key = (base, forms, normed)
    if key not in _fused_classes:
        original = base.forward
        assert isinstance(original, types.FunctionType)  # patch_fused checked it
        chosen = tuple(FORMS[i] for i in forms)
        renames = {}
        for form in chosen:
            # One name per form: two forms of one global name are two families' modules.
            name = f"{rebind.PREFIX}{FORMS.index(form)}_{form.name}"
            renames[form.name] = rebind.install(base.__module__, name, form.replacement)
        if normed:  # forms is (FORMS[0],): _norms_for checked it
            name = f"{rebind.PREFIX}norms_{ROTATION}"
            renames[ROTATION] = rebind.install(base.__module__, name, NORM_ROTATION)
        fn = rebind.rebuilt(original, renames)
        forward = _with_norms(fn) if normed else fn
        namespace = {"forward": forward, "_posemb_forms": chosen, "_posemb_normed": normed}
        _fused_classes[key] = rebind.subclass(base, FusedAttention, namespace, (fused_class, key))
    return _fused_classes[key]


def _with_norms(fn: types.FunctionType) -> Callable[..., Any]:
    """``fn`` (the rebuilt forward) run with the attention marked as the running one, so that
    its norms may defer to the rotation (:func:`.fused_norm.begin`)."""
    # The code that calls the norms (beneath any decorator): a norm defers only to it.
    code = _innermost(fn).__code__

    @functools.wraps(fn)  # inspect.signature follows __wrapped__ to the class's parameters
    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if _checks.tracing():  # nothing defers while tracing (fused_norm)
            return fn(self, *args, **kwargs)
        before = begin(self, code)
        try:
            return fn(self, *args, **kwargs)
        finally:
            end(before)

    return forward


_REPLACED = object()  # an earlier release's instance forward, dropped by __setstate__


def _fused_again(
    module: nn.Module, forms: tuple[int, ...], norms: NormSpec | None = None
) -> object:
    """Unpickling a model an earlier posemb pickled fused (its forward was an instance
    attribute): the module's class swapped to the fused class of this process."""
    module.__class__ = fused_class(type(module), tuple(forms), norms is not None)
    return _REPLACED


def is_fused(module: nn.Module) -> bool:
    """Whether :func:`patch_fused` fused this module (and it still is): its class is a
    :class:`FusedAttention` one, and no forward of another's shadows the class's."""
    if not isinstance(module, FusedAttention):
        return False
    own = module.__dict__.get("forward")
    return own is None or _hooked(module)


def _hooked(module: nn.Module) -> bool:
    """An accelerate hook (``add_hook_to_module``): its forward calls ``_old_forward``."""
    return "_old_forward" in module.__dict__ and hasattr(module, "_hf_hook")


def patch_fused(model: nn.Module, head_dim: int, rotary_dim: int) -> list[str]:
    """Swap each attention module of ``model``'s text model that calls
    ``apply_rotary_pos_emb`` into its :class:`FusedAttention` class (posemb's fused rotation);
    the dotted names of the modules patched (none where every one already is). Raises
    ``ValueError`` naming the family when its rotation is not one posemb expresses, or when no
    attention calls it."""
    from .targets import text_modules

    plan: list[tuple[str, nn.Module, tuple[_Form, ...], NormSpec | None]] = []
    forms: dict[tuple[str, str], _Form] = {}
    already = 0
    for name, module in text_modules(model):
        if is_fused(module):
            late = _late_norms(name, module, head_dim)
            if late is None:
                already += 1
            else:  # norms that could not be fused when it was (on the meta device then)
                plan.append((name, module, *late))
            continue
        if isinstance(module, DeferredNorm):
            continue  # a norm the fused rotation of its attention applies
        if isinstance(module, rebind.Swapped):  # patch_extension's, say: not the class's
            raise InputError(
                f"{name} ({type(module).__name__}) runs a forward posemb swapped in for "
                f"another patch ({type(module).__mro__[1].__name__}); undo that patch first"
            )
        forward = getattr(type(module), "forward", None)
        if not isinstance(forward, types.FunctionType):
            continue
        if "forward" in module.__dict__ and not _hooked(module):
            raise InputError(
                f"{name} ({type(module).__name__}) already has its own forward "
                f"({type(module.__dict__['forward']).__name__}), which posemb did not set; "
                f"patch before wrapping the model, or patch_rotary without fused=True"
            )
        modeling = type(module).__module__
        called = _innermost(forward).__code__.co_names
        rotations = [n for n in called if n.startswith("apply_rotary")]
        fusable = [n for n in rotations if n in NAMES and hasattr(sys.modules.get(modeling), n)]
        if not rotations:
            continue  # vision towers are not among the text model's modules (targets.py)
        if len(fusable) < len(rotations):  # one would stay eager while claiming to be fused
            eager = sorted(set(rotations) - set(fusable))
            raise InputError(
                f"{type(module).__name__} rotates through {', '.join(eager)}, which posemb "
                f"does not fuse (patch_rotary without fused=True swaps the tables only)"
            )
        for rotation in fusable:
            if (modeling, rotation) not in forms:
                forms[(modeling, rotation)] = _form_of(modeling, rotation, head_dim, rotary_dim)
        chosen = tuple(forms[(modeling, r)] for r in sorted(fusable))
        plan.append((name, module, chosen, _norms_for(name, module, chosen, head_dim)))
    if not plan and not already:
        raise InputError(
            f"no attention of this {type(model).__name__} calls a rotation posemb fuses "
            f"({', '.join(NAMES)})"
        )
    # Built before anything changes: rebuilding a forward can still refuse.
    built = [
        (name, module, norms, fused_class(
            rebind.base_of(type(module)), tuple(FORMS.index(f) for f in chosen),
            norms is not None,
        ))
        for name, module, chosen, norms in plan
    ]  # fmt: skip
    # Only now, with every module checked, is anything changed.
    names = []
    for name, module, norms, fused in built:
        cls: Any = fused
        module.__class__ = cls
        if _hooked(module):
            # accelerate's hook calls _old_forward, which it bound itself: fuse beneath it,
            # keep the hook.
            module.__dict__["_old_forward"] = types.MethodType(cls.forward, module)
        module.__dict__.pop(_MARK, None)  # an earlier posemb's mark, which pickling kept
        names.append(name)
        if norms is not None:
            names += [f"{name}.{norm}" for norm in defer(module, norms)]
    return names


def _late_norms(
    name: str, module: nn.Module, head_dim: int
) -> tuple[tuple[_Form, ...], NormSpec] | None:
    """For an attention fused without its norms: its forms and the norms' spec where they can
    be fused now (their weights were loaded since), else None."""
    cls: Any = type(module)
    if not isinstance(module, FusedAttention) or cls._posemb_normed:
        return None
    spec = _norms_for(name, module, cls._posemb_forms, head_dim)
    return None if spec is None else (cls._posemb_forms, spec)


def _norms_for(
    name: str, module: nn.Module, chosen: tuple[_Form, ...], head_dim: int
) -> NormSpec | None:
    """The q and k norms to fuse into ``module``'s rotation, or None (logged once per class
    where the attention has norms that stay separate, with why)."""
    verdict = why_not(module, head_dim)
    if verdict is None:
        return None
    if isinstance(verdict, NormSpec) and chosen != (FORMS[0],):
        verdict = "its rotation is not rotate_half on cat([cos, cos]) tables"
    if isinstance(verdict, str):
        key = f"{type(module).__name__}: {verdict}"
        if key not in _norms_logged:
            _norms_logged.add(key)
            logger.warning(
                "posemb: %s's q_norm and k_norm stay separate from the fused rotation (%s)",
                type(module).__name__,
                verdict,
            )
        return None
    return verdict


_norms_logged: set[str] = set()


def unpatch_fused(model: nn.Module) -> list[str]:
    """Give every attention module that :func:`patch_fused` fused its own class back; the
    dotted names of the modules restored."""
    restored = []
    for name, module in model.named_modules():
        module.__dict__.pop(_MARK, None)
        if not isinstance(module, FusedAttention):
            continue
        base: Any = rebind.base_of(type(module))
        module.__class__ = base
        if isinstance(module.__dict__.get("_old_forward"), types.MethodType):
            module.__dict__["_old_forward"] = types.MethodType(base.forward, module)
        restored.append(name)
        restored += [f"{name}.{norm}" for norm in restore(model.get_submodule(name))]
    return restored


__all__ = [
    "FORMS",
    "FusedAttention",
    "fused_complex_rotation",
    "fused_deinterleaving_rotation",
    "fused_rotation",
    "is_fused",
    "patch_fused",
    "unpatch_fused",
]

# Before this release the fused forward was an object in the instance's __dict__ (FusedForward); the
# fused module's class is the thing now.
__getattr__ = _renamed.module_getattr(__name__, {"FusedForward": "FusedAttention"}, globals())
