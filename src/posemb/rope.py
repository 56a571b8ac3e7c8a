"""Rotary position embedding (RoPE; Su et al. 2021, "RoFormer", section 3.4).

RoPE splits the first ``r`` channels of each query and key head into r/2 planes and turns plane
i at position m by the angle m * theta_i. Because rotations compose, the logit between a query
at m and a key at n depends on n - m only: <R_m q, R_n k> = q^T R_m^T R_n k = q^T R_(n-m) k.

Which channels form a plane is a convention, and both are in wide use:

- ``Layout.HALF`` pairs channel j with j + r/2 (GPT-NeoX, Hugging Face Llama: ``rotate_half``).
- ``Layout.INTERLEAVED`` pairs channel 2j with 2j + 1 (RoFormer, GPT-J, Meta's Llama code).

They are the same embedding up to a fixed permutation of the q/k projection rows
(:func:`permute_layout`); mixing them up gives a model that runs and is quietly wrong.

Three forms of the same rotation live here: :func:`apply_rope` (elementwise, the reference),
:func:`rotation_matrix` (the block-diagonal Givens matrix R_m of the paper's eq. 13) and
:func:`rope_complex` (the complex form of eq. 12). Tests hold them equal.
"""

from __future__ import annotations

import collections

import torch
from torch import nn

from . import _checks, kernels
from . import scaling as _scaling
from ._errors import InputError
from .freqs import angles, cos_sin
from .kernels import fast as _fast
from .kernels.layout import Layout, as_layout, pairs, unpairs
from .kernels.reference import apply_rope  # noqa: F401  (public here as posemb.rope.apply_rope)


def rotation_matrix(
    position: int, inv_freq: torch.Tensor, layout: Layout | str = Layout.HALF
) -> torch.Tensor:
    """The block-diagonal Givens matrix R_m of Su et al. 2021, eq. 13, in float64.

    R_m = diag(G(m theta_1), ..., G(m theta_{r/2})) with G(a) = [[cos a, -sin a], [sin a, cos a]]
    acting on the planes of ``layout``; ``R_m @ v`` rotates a column vector ``v`` of size r.
    An r x r matrix costs O(r^2) per position, which is why nobody computes RoPE this way; it
    exists to state and test the algebra (R_m^T R_n = R_(n-m), det R_m = 1).

    Args:
        position: the position m (any integer).
        inv_freq: ``(r/2,)`` frequencies.
        layout: which channels form a plane.

    Returns:
        float64 tensor of shape ``(r, r)``.
    """
    lay = as_layout(layout)
    a = angles(torch.tensor([int(position)]), inv_freq)[0]
    c, s = torch.cos(a), torch.sin(a)
    n = a.shape[0]
    idx = torch.arange(n)
    first, second = (idx, idx + n) if lay is Layout.HALF else (2 * idx, 2 * idx + 1)
    m = torch.zeros(2 * n, 2 * n, dtype=torch.float64)
    m[first, first] = c
    m[first, second] = -s
    m[second, first] = s
    m[second, second] = c
    return m


def rope_complex(
    x: torch.Tensor,
    positions: torch.Tensor | list[int],
    inv_freq: torch.Tensor,
    layout: Layout | str = Layout.HALF,
) -> torch.Tensor:
    """RoPE as complex multiplication (Su et al. 2021, eq. 12): z_i -> z_i * exp(i m theta_i).

    Each plane (a, b) is the complex number a + i b; multiplying by the unit complex number
    exp(i m theta) turns it by m theta. Computed in complex128.

    Args:
        x: ``(..., seq, r)`` where r = 2 * len(inv_freq).
        positions: ``(seq,)`` integers.
        inv_freq: ``(r/2,)`` frequencies.
        layout: which channels form a plane.

    Returns:
        Tensor shaped and typed like ``x``.
    """
    x = _checks.float_tensor("x", x)
    _checks.float_tensor("inv_freq", inv_freq)
    lay = as_layout(layout)
    pos = _checks.positions(positions, max_dim=1)
    if (
        inv_freq.dim() != 1
        or x.dim() < 2
        or x.shape[-1] != 2 * inv_freq.shape[0]
        or x.shape[-2] != pos.shape[0]
    ):
        raise InputError(
            f"x must have shape (..., {pos.shape[0]}, {2 * inv_freq.shape[0]}) for "
            f"{pos.shape[0]} positions and {inv_freq.shape[0]} frequencies, "
            f"got shape {tuple(x.shape)}"
        )
    a, b = pairs(x.to(torch.float64), lay)
    theta = angles(pos, inv_freq).to(x.device)
    z = torch.complex(a, b) * torch.polar(torch.ones_like(theta), theta)
    return unpairs(z.real, z.imag, lay).to(x.dtype)


CACHE_ROWS = 1 << 18
"""Most rows a module caches per (device, dtype): 64 MiB of float32 tables at rotary_dim 128."""


_TABLES_MAX = 256  # cos/sin tables a module keeps (each per device, dtype and length)


class RotaryEmbedding(nn.Module):
    """Rotates queries and keys by their positions; no parameters, no state.

    Args:
        head_dim: channels per head of q and k.
        base: frequency base; must exceed 1 (10000 in RoFormer and Llama 2, 500000 in Llama 3).
        rotary_dim: channels that rotate (the first ones of each head); even, <= head_dim;
            default all (GPT-NeoX and Phi rotate a fraction).
        layout: which channels form a plane (:class:`Layout`).
        scaling: a :mod:`posemb.scaling` object; default :class:`posemb.scaling.Default`.
        backend: how to rotate: "auto" (the fastest available for the tensors' device and
            dtype), "reference", "cpu" (fused C++ loop) or "triton" (GPU kernel); see
            :mod:`posemb.kernels`.
    """

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        layout: Layout | str = Layout.HALF,
        scaling: _scaling.RopeScaling | None = None,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        self.head_dim, self._rotary_dim = _checks.rotary_dims(head_dim, rotary_dim)
        self.base = base
        self.layout = as_layout(layout)
        self.scaling = scaling
        if backend not in kernels.BACKENDS:
            raise InputError(
                f"backend must be one of {', '.join(kernels.BACKENDS)}, got {backend!r}"
            )
        self.backend = backend
        if backend in ("auto", "cpu"):
            # Load (or build, once per machine) the CPU kernel now rather than inside a
            # forward that torch.compile may be tracing.
            kernels.cpu.load()
        # Tables per (device, dtype, what of the length the scaling reads): formed once in
        # float64, grown by doubling; not buffers, so .half() cannot degrade them and no
        # checkpoint carries them.
        self._tables: collections.OrderedDict[tuple, torch.Tensor] = collections.OrderedDict()
        self.table_builds = 0
        """How many float64 tables this module has formed (tests count them)."""
        self._fast_signature: _fast.Signature | None = None

    def __getstate__(self) -> dict[str, object]:
        # The tables are a cache (up to 64 MiB each): a pickle or deep copy forms its own.
        state = super().__getstate__()
        state["_tables"] = collections.OrderedDict()
        state["_fast_signature"] = None
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        # A module pickled before base, rotary_dim and scaling became properties keeps them
        # under their plain names, which the properties now hide; its table keys are stale.
        for name in ("base", "rotary_dim", "scaling"):
            if name in state:
                state["_" + name] = state.pop(name)
        state["_tables"] = collections.OrderedDict()
        state["_fast_signature"] = None
        super().__setstate__(state)

    # What the tables depend on is checked when it is set, and is in every table's key: a
    # module whose base, rotary_dim or scaling is changed after a call never serves the old
    # tables (it rotated at the old base, or by a table of the wrong width).
    @property
    def base(self) -> float:
        """The RoPE base (theta); settable, checked, and part of every cached table's key."""
        return self._base

    @base.setter
    def base(self, value: float) -> None:
        self._base = _checks.base(value)

    @property
    def rotary_dim(self) -> int:
        """Channels rotated per head (even, <= head_dim); settable, checked, in the key."""
        return self._rotary_dim

    @rotary_dim.setter
    def rotary_dim(self, value: int) -> None:
        self._rotary_dim = _checks.rotary_dims(self.head_dim, value)[1]

    @property
    def scaling(self) -> _scaling.RopeScaling:
        """The context-extension schedule (:mod:`posemb.scaling`); None sets the default."""
        return self._scaling

    @scaling.setter
    def scaling(self, value: _scaling.RopeScaling | None) -> None:
        self._scaling = _scaling.check(value)

    def cos_sin(
        self,
        positions: torch.Tensor,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Cos and sin tables for ``positions``, the scaling's attention factor applied.

        Args:
            positions: integers of any shape ``P``.
            dtype: output dtype.
            device: output device; default that of ``positions``.

        Returns:
            ``(cos, sin)``, each ``P + (rotary_dim // 2,)``.
        """
        pos = _checks.positions(positions)
        seq_len = None
        if self.scaling.depends_on_length and pos.numel():
            if torch._C._functorch.is_batchedtensor(pos):
                raise InputError(
                    f"{type(self.scaling).__name__} reads the call's largest position, which "
                    f"vmap over positions cannot give; vmap over q and k with the positions "
                    f"fixed, or loop"
                )
            # The length a length-dependent scaling sees is max position + 1 over the whole
            # call, as transformers measures it; computed per call and never stored, where
            # transformers keeps the longest seen (docs/hf.md says where that differs).
            seq_len = int(pos.max()) + 1
        return self._cos_sin(pos, dtype, device, seq_len)

    def _cos_sin(
        self,
        pos: torch.Tensor,
        dtype: torch.dtype,
        device: torch.device | str | None,
        seq_len: int | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`cos_sin` with the length the scaling sees given by the caller."""
        dev = torch.device(device) if device is not None else pos.device
        inv, factor = _scaling.cached_compute(
            self.scaling, self.rotary_dim, self.base, dev, seq_len
        )
        cos, sin = cos_sin(pos, inv, dtype=dtype)
        if factor != 1.0:
            cos, sin = cos * factor, sin * factor
        return cos, sin

    def _table(
        self, rows: int, seq_len: int, device: torch.device, dtype: torch.dtype
    ) -> torch.Tensor:
        """Cached ``(2, rows', r/2)`` stack of cos and sin for positions 0..rows'-1, rows' >=
        ``rows``, for a call of length ``seq_len`` (stacked: one gather serves both)."""
        # The scaling is in the key: assigning another one (the lab swaps schedules on a trained
        # model) must never be served the old one's table.
        length = self.scaling.length_key(seq_len)
        key = (device, dtype, self.scaling, self.base, self.rotary_dim, length)
        hit = self._tables.get(key)
        if hit is None or hit.shape[1] < rows:
            # Doubling: a decode loop that grows one token at a time builds log(n) tables.
            size = max(rows, min(2 * hit.shape[1] if hit is not None else 0, CACHE_ROWS))
            # Never an inference tensor: a table made under inference_mode and kept would
            # break every later call that trains ("cannot be saved for backward").
            with torch.inference_mode(False):
                pos = torch.arange(size, device=device)
                cos, sin = self._cos_sin(pos, dtype, device, seq_len)
                hit = torch.stack((cos, sin))
            self.table_builds += 1
            self._tables[key] = hit
            if len(self._tables) > _TABLES_MAX:
                self._tables.popitem(last=False)
        self._tables.move_to_end(key)
        return hit

    def _call_tables(
        self, positions: torch.Tensor | None, pos: torch.Tensor, seq: int, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin for one forward: from the cache in eager mode, formed in the graph when
        compiling or exporting (Inductor fuses the float64 arithmetic; a cache would be state to
        guard, and a table made under a fake mode is not a real tensor)."""
        compute = _checks.compute_dtype(x)
        if positions is None:
            # Default positions 0..seq-1: the length is known on the host, no sync.
            if _checks.tracing() or seq > CACHE_ROWS or not self.scaling.reuses_tables(seq):
                return self._cos_sin(pos, compute, x.device, seq)
            both = self._table(seq, seq, x.device, compute)
            return both[0, :seq], both[1, :seq]
        table = self._explicit_table(pos, x)
        if table is None:
            return self.cos_sin(pos, dtype=compute, device=x.device)
        both = table[:, pos]  # one gather for both
        return both[0], both[1]

    def _explicit_table(self, pos: torch.Tensor, x: torch.Tensor) -> torch.Tensor | None:
        """The cached ``(2, rows, r/2)`` cos/sin stack explicit positions ``pos`` (on x's
        device) gather from, in x's compute dtype; None where they are formed directly instead:
        while tracing, for no positions, and for negative or far ones (rather than growing a
        table to reach them) or a scaling whose tables depend on the call."""
        if _checks.tracing() or not pos.numel():
            return None
        if pos.device.type != "cpu":
            # Reading their range would be a host sync per call, and none can be captured in
            # a CUDA graph: the angles are formed on the device from the positions instead.
            return None
        if pos.numel() <= 64:  # a decode step: one small copy
            values = pos.flatten().tolist()
            lo, hi = min(values), max(values)
        else:
            lo, hi = (int(v) for v in torch.aminmax(pos))
        if lo < 0 or hi >= CACHE_ROWS or not self.scaling.reuses_tables(hi + 1):
            return None
        return self._table(hi + 1, hi + 1, x.device, _checks.compute_dtype(x))

    def _positions(
        self, x: torch.Tensor, positions: object, name: str = "positions"
    ) -> torch.Tensor:
        return _checks.positions_for(
            name, positions, batch=x.shape[0], length=x.shape[2], device=x.device
        )

    def _check(self, name: str, x: object) -> torch.Tensor:
        return _checks.heads_tensor(name, x, self.head_dim)

    def rotate(
        self, x: torch.Tensor, positions: torch.Tensor | None = None, inplace: bool = False
    ) -> torch.Tensor:
        """Rotate one tensor ``(batch, heads, seq, head_dim)``; as :meth:`forward`."""
        x = self._check("x", x)
        # A k with zero heads lets the single tensor take the same path as a (q, k) pair.
        return self.forward(x, x[:, :0], positions, inplace=inplace)[0]

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor | None = None,
        inplace: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate queries and keys that sit at the same positions.

        Args:
            q: ``(batch, q_heads, seq, head_dim)``; any strides with unit stride in head_dim
                (a ``(batch, seq, heads, dim)`` tensor transposed is fine).
            k: ``(batch, kv_heads, seq, head_dim)``; kv_heads may differ from q_heads (GQA/MQA).
            positions: ``(seq,)`` or ``(batch, seq)`` integers, any values (a KV-cache decode
                step passes its offset here); default ``0 .. seq-1``.
            inplace: rotate q and k in their own memory (inference; refuses tensors that
                require grad). Out of place otherwise.

        Returns:
            ``(q, k)`` rotated, each with its input's shape and dtype.
        """
        signature = self._decode_signature(q, k, positions, inplace)
        if signature is not None and signature[0] == self._fast_signature:
            hit = _fast.TABLES.get(signature[1])
            if hit is not None:  # a call shaped like this one passed every check below
                return _fast.rotate_cpu(q, k, *hit, self.layout is Layout.INTERLEAVED)
        q = self._check("q", q)
        k = self._check("k", k)
        if k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
            raise InputError(
                f"q and k must share batch and seq (they sit at the same positions), got "
                f"q {tuple(q.shape)} and k {tuple(k.shape)}"
            )
        pos = self._positions(q, positions)
        cos, sin = self._call_tables(positions, pos, q.shape[2], q)
        if signature is None:
            return kernels.rotate(
                q, k, cos, sin, layout=self.layout, backend=self.backend, inplace=inplace
            )
        cos, sin = _fast.op_table(cos), _fast.op_table(sin)
        out = kernels.rotate(q, k, cos, sin, layout=self.layout)
        if _fast.known_rotate(_fast.rotate_signature(q, k, cos, sin, self.layout)):
            self._fast_signature = signature[0]  # kernels.rotate took the op: all checks held
            _fast.TABLES.put(signature[1], cos, sin)
        return out

    def _decode_signature(
        self, q: object, k: object, positions: object, inplace: bool
    ) -> tuple[_fast.Signature, _fast.Signature] | None:
        """What :meth:`forward`'s checks read of a call, and what its tables depend on; None
        where the fast path (:mod:`posemb.kernels.fast`) does not apply."""
        if (
            inplace
            or self.backend != "auto"
            or type(positions) is not torch.Tensor
            or type(self) is not RotaryEmbedding  # a subclass may form its tables otherwise
            or not _fast.plain(q, k)
        ):
            return None
        assert isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)
        if q.dtype not in kernels.cpu.DTYPES:  # float64 rotates by float64 tables
            return None
        values = _fast.position_values(positions)
        if values is None:
            return None
        checked = (
            _fast.tensor_signature(q),
            _fast.tensor_signature(k),
            positions.shape,
            positions.dtype,
            self.head_dim,
            self.layout,
            torch.is_grad_enabled(),
        )
        tables = (self._scaling, self._base, self._rotary_dim, positions.shape, values)
        return checked, tables

    def schedule(self, seq_len: int | None) -> tuple[torch.Tensor, float]:
        """The inverse frequencies ``(rotary_dim / 2,)`` (float64, CPU) and attention factor
        this module rotates with in a call whose length is ``seq_len`` (what a length-dependent
        scaling such as :class:`~posemb.scaling.LongRope` or dynamic NTK reads; ignored by
        the others)."""
        return _scaling.cached_compute(self.scaling, self.rotary_dim, self.base, "cpu", seq_len)

    def rerotate(
        self,
        k: torch.Tensor,
        from_positions: torch.Tensor,
        to_positions: torch.Tensor,
        source: RotaryEmbedding | None = None,
        *,
        from_length: int | None = None,
        to_length: int | None = None,
        fused: bool = False,
    ) -> torch.Tensor:
        """Keys rotated at ``from_positions`` (by ``source``, default this module) as this
        module rotates them at ``to_positions``: for a KV cache that evicts tokens and moves
        the rest (attention sinks, context shift), or whose schedule changed.

        Each pair turns by the difference of its two angles, formed in float64 from the two
        positions and the two schedules (never by composing rounded tables), and is scaled by
        the ratio of the attention factors. By default the turn is applied in float64 and the
        key rounded once to its dtype, so re-rotating a key many times costs what storing it
        that many times costs (rounding noise growing like sqrt(n)). ``fused=True`` applies it
        with this module's backend in the key's dtype instead: one pass, but its rounded
        cos/sin of a recurring difference repeat the same error at every shift, which grows
        linearly over many of them.

        Args:
            k: ``(batch, heads, seq, head_dim)`` keys, rotated as ``source`` rotates them.
            from_positions: ``(seq,)`` or ``(batch, seq)`` integers they were rotated at.
            to_positions: the same shape: where they are to be.
            source: the module that rotated them, when another schedule than this one
                (same head_dim, rotary_dim and layout).
            from_length: the call length the source rotated them in (length-dependent
                scalings only); default the largest from-position + 1.
            to_length: the same for this module; default the largest to-position + 1.
            fused: rotate in the key's dtype with the module's backend (see above).

        Returns:
            ``k`` re-rotated, its shape and dtype.

        Raises:
            ValueError: positions of other shapes, or a source with another geometry.
        """
        src = self if source is None else source
        k = self._check("k", k)
        self._check_source(src)
        start = self._positions(k, from_positions, "from_positions")
        end = self._positions(k, to_positions, "to_positions")
        if start.shape != end.shape:
            raise InputError(
                f"from_positions and to_positions must have one shape, got {tuple(start.shape)} "
                f"and {tuple(end.shape)}"
            )
        if from_length is None and start.numel():
            from_length = int(start.max()) + 1
        if to_length is None and end.numel():
            to_length = int(end.max()) + 1
        inv_from, factor_from = src.schedule(from_length)
        inv_to, factor_to = self.schedule(to_length)
        delta = angles(end.cpu(), inv_to) - angles(start.cpu(), inv_from)
        ratio = factor_to / factor_from
        cos, sin = torch.cos(delta) * ratio, torch.sin(delta) * ratio
        if fused:
            dtype = _checks.compute_dtype(k)
            out, _ = kernels.rotate(
                k, k[:, :0], cos.to(k.device, dtype), sin.to(k.device, dtype),
                layout=self.layout, backend=self.backend,
            )  # fmt: skip
            return out
        wide = k.to(torch.float64)
        out, _ = kernels.rotate(
            wide, wide[:, :0], cos.to(k.device), sin.to(k.device),
            layout=self.layout, backend="reference",
        )  # fmt: skip
        return out.to(k.dtype)

    def _check_source(self, source: object) -> None:
        # This module first: XPos(16).rerotate(k, p, p) blamed a source nobody passed.
        if isinstance(self, XPos):
            raise InputError(
                "XPos keys carry a position-dependent scale; they cannot be re-rotated"
            )
        if not isinstance(source, RotaryEmbedding) or isinstance(source, XPos):
            raise InputError(
                f"source must be a RotaryEmbedding (XPos keys carry a position-dependent scale, "
                f"not a rotation), got {type(source).__name__}"
            )
        for field in ("head_dim", "rotary_dim", "layout"):
            if getattr(source, field) != getattr(self, field):
                raise InputError(
                    f"source.{field} is {getattr(source, field)!r}, this module's is "
                    f"{getattr(self, field)!r}: a key rotated in one geometry cannot be "
                    f"re-rotated into another"
                )

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base:g}, "
            f"layout={self.layout.value}, scaling={self.scaling!r}, backend={self.backend!r}"
        )


def xpos_zeta(
    rotary_dim: int, gamma: float, device: torch.device | str | None = None
) -> torch.Tensor:
    """xPos's per-pair decay base zeta_i = (2i/d + gamma) / (1 + gamma) (Sun et al. 2022, eq. 10).

    Args:
        rotary_dim: rotated channels d; even.
        gamma: > 0 (the paper uses 0.4).
        device: output device.

    Returns:
        float64 ``(rotary_dim // 2,)``, increasing, each in (0, 1).
    """
    _checks.even_int("rotary_dim", rotary_dim)
    g = _checks.number("gamma", gamma, minimum=0.0, strict=True)
    i = torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=device)
    return (i / rotary_dim + g) / (1 + g)


XPOS_ROLES = ("query", "key")


class XPos(RotaryEmbedding):
    """xPos, Sun et al. 2022 ("A Length-Extrapolatable Transformer"), section 3.2: RoPE whose
    pair i is also scaled by zeta_i^(m / B) on the query and zeta_i^(-n / B) on the key, with
    zeta_i = (2i/d + gamma) / (1 + gamma) < 1 (:func:`xpos_zeta`). The logit then carries
    zeta_i^((m - n) / B): the product depends on the distance only, and attention to far keys
    decays smoothly.

    Queries and keys take opposite scales, so a tensor must say which it is: :meth:`rotate`
    takes ``role="query"`` or ``role="key"``, and :meth:`forward` takes both, in one fused call
    (the key side gets tables of its own, see :func:`posemb.kernels.rotate`).

    The paper uses gamma = 0.4 and B = 512 and pairs it with causal attention (for m >= n the
    factor is <= 1). The per-position scale over- or underflows float32 once |m| / B reaches a
    few hundred, so a centre c is subtracted from every position first (the relative property
    is untouched). ``center=None`` lets it follow each call: c = (largest position + 1) // 2,
    the middle of the sequence, as torchscale's xPos does (one host sync per call); an integer
    fixes it. Use a fixed centre when decoding over a KV cache: keys cached at one call's centre
    do not match queries scaled at the next call's. The scales are formed in float64 on each
    call's device from (gamma, rotary_dim): no state, so ``.to()``/``.half()`` cannot degrade
    them.

    Args:
        head_dim: as in :class:`RotaryEmbedding`.
        base: as in :class:`RotaryEmbedding`.
        rotary_dim: as in :class:`RotaryEmbedding`.
        layout: as in :class:`RotaryEmbedding`.
        backend: as in :class:`RotaryEmbedding`.
        gamma: > 0.
        scale_base: B > 0, in tokens.
        center: position subtracted before scaling, or None to follow each call's length.
    """

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        layout: Layout | str = Layout.HALF,
        gamma: float = 0.4,
        scale_base: float = 512.0,
        center: int | None = 0,
        backend: str = "auto",
    ) -> None:
        super().__init__(head_dim, base, rotary_dim, layout, backend=backend)
        self.gamma = _checks.number("gamma", gamma, minimum=0.0, strict=True)
        self.scale_base = _checks.number("scale_base", scale_base, minimum=0.0, strict=True)
        if center is not None and (isinstance(center, bool) or not isinstance(center, int)):
            raise InputError(f"center must be an integer position or None, got {center!r}")
        self.center = center

    def scales(
        self, positions: torch.Tensor, role: str = "query", center: int | None = None
    ) -> torch.Tensor:
        """zeta_i^(+-(p - c) / B) for positions ``P``: float64 ``P + (rotary_dim // 2,)``.

        Args:
            positions: integers of any shape ``P``.
            role: "query" (exponent +) or "key" (exponent -).
            center: c; default the module's ``center`` (which must then be an integer).
        """
        sign = self._sign(role)
        c = self._fixed_center(center)
        p = _checks.positions(positions).to(torch.float64) - c
        zeta = xpos_zeta(self.rotary_dim, self.gamma, device=p.device)
        return zeta ** (sign * p.unsqueeze(-1) / self.scale_base)

    def _fixed_center(self, center: int | None) -> int:
        c = self.center if center is None else center
        if c is None:
            raise InputError(
                "this XPos has center=None (it follows each call); rotating one side alone "
                "needs center= given, the same for queries and keys"
            )
        return c

    @staticmethod
    def _sign(role: str) -> float:
        if role not in XPOS_ROLES:
            raise InputError(
                f"role must be 'query' or 'key' (xPos scales them oppositely), got {role!r}"
            )
        return 1.0 if role == "query" else -1.0

    def _scaled_tables(
        self, x: torch.Tensor, pos: torch.Tensor, role: str, center: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Scaled cos/sin for ``x`` at ``pos``: formed in float64, cast once."""
        cos, sin = self.cos_sin(pos, dtype=torch.float64, device=x.device)
        scale = self.scales(pos.to(x.device), role, center)
        compute = _checks.compute_dtype(x)
        return (cos * scale).to(compute), (sin * scale).to(compute)

    # A deliberate break with the parent's signature: a silent default role would give wrong
    # logits for keys, so callers must say which side they rotate.
    def rotate(  # type: ignore[override]
        self,
        x: torch.Tensor,
        positions: torch.Tensor | None = None,
        inplace: bool = False,
        *,
        role: str,
        center: int | None = None,
    ) -> torch.Tensor:
        """Rotate and scale one tensor ``(batch, heads, seq, head_dim)`` as a query or a key.

        Args:
            x: ``(batch, heads, seq, head_dim)``.
            positions: ``(seq,)`` or ``(batch, seq)``; default 0..seq-1.
            inplace: must be False.
            role: "query" (scaled by zeta^(m/B)) or "key" (by zeta^(-n/B)); required, since
                the two differ and a silent default would give wrong logits.
            center: overrides the module's centre; required when that is None.

        Returns:
            Tensor shaped and typed like ``x``.
        """
        self._sign(role)
        if inplace:
            raise InputError("XPos does not rotate in place (q and k take different scales)")
        x = self._check("x", x)
        pos = self._positions(x, positions)
        c, s = self._scaled_tables(x, pos, role, self._fixed_center(center))
        return kernels.rotate(x, x[:, :0], c, s, layout=self.layout, backend=self.backend)[0]

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor | None = None,
        inplace: bool = False,
        k_positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate and scale q (up) and k (down); ``k_positions`` for a k of another length.

        Args:
            q: ``(batch, heads, q_len, head_dim)``.
            k: ``(batch, kv_heads, k_len, head_dim)``.
            positions: q positions ``(q_len,)`` or ``(batch, q_len)``; default 0..q_len-1.
            inplace: must be False (the scaled tables differ for q and k).
            k_positions: k positions; default ``positions`` when k_len == q_len.

        Returns:
            ``(q, k)``.
        """
        if inplace:
            raise InputError("XPos does not rotate in place (q and k take different scales)")
        q = self._check("q", q)
        k = self._check("k", k)
        qp = self._positions(q, positions)
        same = k_positions is None
        if same and k.shape[2] != q.shape[2]:
            raise InputError("k_positions is required when k and q differ in length")
        kp = qp if same else self._positions(k, k_positions)
        center = self.center
        if center is None:  # the middle of this call's sequence, shared by both sides
            center = (int(torch.maximum(qp.max(), kp.max())) + 1) // 2 if qp.numel() else 0
        cq, sq = self._scaled_tables(q, qp, "query", center)
        ck, sk = self._scaled_tables(k, kp, "key", center)
        if same and k.shape[0] == q.shape[0]:
            return kernels.rotate(
                q, k, cq, sq, k_cos=ck, k_sin=sk, layout=self.layout, backend=self.backend
            )
        q_out = kernels.rotate(q, q[:, :0], cq, sq, layout=self.layout, backend=self.backend)[0]
        k_out = kernels.rotate(k, k[:, :0], ck, sk, layout=self.layout, backend=self.backend)[0]
        return q_out, k_out

    def extra_repr(self) -> str:
        return (
            super().extra_repr()
            + f", gamma={self.gamma:g}, scale_base={self.scale_base:g}, center={self.center}"
        )


def permute_layout(
    weight: torch.Tensor,
    num_heads: int,
    to: Layout | str,
    rotary_dim: int | None = None,
) -> torch.Tensor:
    """Reorder the output rows of a q or k projection so a model runs under the other layout.

    Converting Meta's interleaved checkpoints to Hugging Face's ``rotate_half`` form is this
    permutation (to ``HALF``): within each head, old rows (2j, 2j+1) become rows (j, j + r/2).
    Because q and k are permuted alike, every logit q . k is unchanged, and v and the output
    projection need nothing. The other direction is the inverse permutation.

    Args:
        weight: ``(num_heads * head_dim, in_features)`` weight or ``(num_heads * head_dim,)``
            bias, in the layout opposite to ``to``.
        num_heads: heads in this projection (the KV head count for a GQA k projection).
        to: the layout the result is for.
        rotary_dim: rotated channels per head (partial rotary); default all of ``head_dim``.

    Returns:
        A new tensor shaped like ``weight``; the input is not modified.
    """
    w = _checks.float_tensor("weight", weight)
    _checks.positive_int("num_heads", num_heads)
    lay = as_layout(to)
    if w.dim() not in (1, 2) or w.shape[0] % num_heads:
        raise InputError(
            f"weight must be (num_heads * head_dim, in_features) or (num_heads * head_dim,) with "
            f"rows divisible by num_heads = {num_heads}, got shape {tuple(w.shape)}"
        )
    head_dim = w.shape[0] // num_heads
    r = head_dim if rotary_dim is None else rotary_dim
    _checks.even_int("rotary_dim", r)
    if r > head_dim:
        raise InputError(f"rotary_dim must be <= head_dim = {head_dim}, got {rotary_dim!r}")
    half = torch.arange(r // 2)
    if lay is Layout.HALF:
        within = torch.cat((2 * half, 2 * half + 1))
    else:
        within = torch.stack((half, half + r // 2), dim=-1).flatten()
    within = torch.cat((within, torch.arange(r, head_dim)))
    rows = (torch.arange(num_heads)[:, None] * head_dim + within).flatten()
    return w.index_select(0, rows.to(w.device))
