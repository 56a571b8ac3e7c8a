"""A copy of a transformers method that calls posemb's functions in place of a few of its module's
globals, and sees every other global as the module holds it now.

transformers' attention ``forward`` calls ``apply_rotary_pos_emb`` (and
``ALL_ATTENTION_FUNCTIONS``, ``eager_attention_forward``) by module-global name at call time.
To send one model's attention through posemb without touching the class or any other model,
posemb rebinds the ``forward`` of each attention *instance* to a copy of its class's function.

An earlier version gave that copy a snapshot of the modeling module's globals with the names
replaced. A snapshot goes stale: a tool that wraps ``modeling_llama.eager_attention_forward``
after the first patch in the process (attention capture, attention editing) was ignored by
every model patched later, so what the process did before decided the answer. So the copy keeps
the module's own globals, live, and only its code differs: each replaced name is renamed in the
code (``co_names``) to a name of posemb's own (``_posemb_...``), installed in the modeling
module beside the original. The module gains those few names, which nothing else reads; none of
its own is changed.

Caches: :data:`_CODES` holds each renamed code object, keyed on the original code object and
the renames (both immutable values), so every instance of a class shares one code object and
``torch.compile`` compiles it once; it is bounded by the classes and rename sets a process uses.
"""

from __future__ import annotations

import dis
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any, SupportsIndex

from .._errors import InputError

PREFIX = "_posemb_"
"""Every name posemb installs in a modeling module starts with this."""

_CODES: dict[tuple[types.CodeType, tuple[tuple[str, str], ...]], types.CodeType] = {}


def install(module_name: str, name: str, value: object) -> str:
    """Put ``value`` in module ``module_name`` as ``name`` (which must start with
    :data:`PREFIX`), for renamed code to call; the name."""
    if not name.startswith(PREFIX):
        raise ValueError(f"an installed name must start with {PREFIX!r}, got {name!r}")
    sys.modules[module_name].__dict__[name] = value
    return name


def _renamed_code(code: types.CodeType, renames: tuple[tuple[str, str], ...]) -> types.CodeType:
    key = (code, renames)
    hit = _CODES.get(key)
    if hit is not None:
        return hit
    table = dict(renames)
    for ins in dis.get_instructions(code):
        if ins.opcode in dis.hasname and ins.argval in table and ins.opname != "LOAD_GLOBAL":
            # The same name read as an attribute or stored would be renamed too.
            raise InputError(
                f"{code.co_qualname if hasattr(code, 'co_qualname') else code.co_name} uses "
                f"{ins.argval} other than as a global ({ins.opname}); posemb cannot rebind it"
            )
    consts = tuple(
        _renamed_code(c, renames) if isinstance(c, types.CodeType) else c for c in code.co_consts
    )
    names = tuple(table.get(n, n) for n in code.co_names)
    hit = code.replace(co_names=names, co_consts=consts)
    _CODES[key] = hit
    return hit


def rebuilt(fn: types.FunctionType, renames: Mapping[str, str]) -> types.FunctionType:
    """A copy of ``fn`` whose code reads global ``renames[n]`` wherever it read global ``n``,
    with ``fn``'s own (live) globals; decorator layers (``functools.wraps`` wrappers, e.g.
    ``deprecate_kwarg``) are rebuilt around the new inner function.

    Raises ``ValueError`` where a renamed name is used other than as a global (an attribute of
    the same name would be renamed too) or a decorator cannot be rebuilt.
    """
    key = tuple(sorted(renames.items()))
    inner = getattr(fn, "__wrapped__", None)
    if inner is None:
        new = types.FunctionType(
            _renamed_code(fn.__code__, key),
            fn.__globals__,
            fn.__name__,
            fn.__defaults__,
            fn.__closure__,
        )
    else:
        new_inner = rebuilt(inner, renames)
        cells = tuple(
            types.CellType(new_inner) if cell.cell_contents is inner else cell
            for cell in fn.__closure__ or ()
        )
        if not any(c.cell_contents is new_inner for c in cells):
            raise InputError(f"cannot rebuild the decorator around {fn.__qualname__}")
        new = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, cells)
        new.__wrapped__ = new_inner  # type: ignore[attr-defined]
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__annotations__ = dict(fn.__annotations__)  # what inspect.signature shows
    new.__qualname__ = fn.__qualname__
    new.__doc__ = fn.__doc__
    return new


class Swapped:
    """The mixin of every class posemb swaps a transformers module into: a subclass of the
    module's own class (which is never touched) that overrides ``forward``, made once per base
    class and variant by a factory, with the base's name, qualified name and module.

    Why a class and not a ``forward`` in the instance's ``__dict__``: a bound method there is
    bound to the module it was made for, and travels with the ``__dict__`` into a ``copy.copy``
    or an ``nn.DataParallel`` replica, which then compute with the original's weights. A
    class's method binds to whichever instance calls it. Instances pickle (and copy and
    deep-copy) as their base class plus the factory's arguments, so the class is made again
    on load, in any process that can import posemb.
    """

    _posemb_remake: tuple[Callable[..., type], tuple[Any, ...]]
    _posemb_base: type

    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple[Any, ...]:
        factory, args = type(self)._posemb_remake
        return (_remade, (factory, args), self.__getstate__())


def _remade(factory: Callable[..., type], args: tuple[Any, ...]) -> object:
    cls: Any = factory(*args)
    return cls.__new__(cls)


def subclass(
    base: type, mixin: type, namespace: dict[str, Any], remake: tuple[Callable[..., type], tuple]
) -> type:
    """A subclass of ``mixin`` (a :class:`Swapped`) and ``base`` with ``namespace``, named as
    ``base`` is (logs, ``type(m).__name__`` checks and the output recorders of transformers
    see the family's class), that pickles through ``remake``: ``(factory, args)``."""
    cls: Any = type(base.__name__, (mixin, base), dict(namespace))
    cls.__qualname__ = base.__qualname__
    cls.__module__ = base.__module__
    cls._posemb_remake = remake
    cls._posemb_base = base
    return cls


def base_of(cls: type) -> Any:
    """The class a :func:`subclass` was made from (``cls`` itself if it is none)."""
    return cls.__dict__.get("_posemb_base", cls)


def installed(module: types.ModuleType | str) -> dict[str, Any]:
    """The names posemb installed in ``module`` (tests; inspection)."""
    mod = sys.modules[module] if isinstance(module, str) else module
    return {k: v for k, v in vars(mod).items() if k.startswith(PREFIX)}


__all__ = ["PREFIX", "Swapped", "base_of", "install", "installed", "rebuilt", "subclass"]
