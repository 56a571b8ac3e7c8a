"""Multimodal rotary embeddings: M-RoPE for mixed text/image/video and 2D RoPE for vision patches.

M-RoPE (Wang et al. 2024, "Qwen2-VL", arXiv:2409.12191, section 2.1) gives every token three
position ids, temporal, height and width, and splits the rotated channel pairs among them: pair i
turns by ``p_axis(i) * theta_i``, where theta_i is the ordinary frequency ladder over the rotated
channels (:func:`posemb.freqs.inv_freq`). A text token has the same id on all three axes, so on
text M-RoPE is exactly 1D RoPE; the tokens of an image share one temporal id and take their row
and column as height and width; a video's frames count up the temporal axis. Each modality's
numbering starts one past the largest id used before it.

Which pairs follow which axis (``mrope_section = (s_t, s_h, s_w)``, summing to rotary_dim/2):

- chunked (Qwen2-VL, Qwen2.5-VL): three consecutive blocks, e.g. (16, 24, 24) of 64 pairs gives
  pairs 0-15 temporal (the fastest frequencies), 16-39 height, 40-63 width.
- interleaved (Qwen3-VL, Qwen3.5; "MRoPE-Interleave", Huang et al. 2025, arXiv:2510.23095):
  pair j follows axis j mod 3 for the first 3*s_h (height) and 3*s_w (width) pairs, the rest
  temporal, so every axis sees the whole spectrum instead of one band of it.

The pairing is ``Layout.HALF`` (pair j is channels j and j + r/2), Hugging Face's
``rotate_half``; transformers writes its tables as ``cat(f, f)`` of width r, the same numbers.

The Qwen2-VL vision tower uses a 2D (axial) RoPE: each patch has a (row, column) position, the
first half of the pairs follow the row and the second half the column, with frequencies of a
ladder over head_dim/2 channels (:func:`vision_cos_sin`).

Precision: as everywhere in posemb (:mod:`posemb.freqs`), angles are formed in float64, reduced
and cast once. transformers forms them in float32 (``position.float() * inv_freq``), which drifts
by up to a few float32 roundoffs of the angle, about ``p * 2^-23`` rad at position p.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import nn

from . import _checks, kernels
from . import scaling as _scaling
from ._errors import InputError
from .freqs import angles
from .freqs import inv_freq as _inv_freq

AXES = ("temporal", "height", "width")
"""The three M-RoPE axes, in the order of ``mrope_section`` and of positions' first dimension."""

TEXT_AFTER_VISION = ("max_plus_one", "spatial")
"""Rules for where numbering resumes after an image or video (:func:`mrope_position_ids`)."""


def _section(section: object) -> tuple[int, int, int]:
    values = list(section) if isinstance(section, (list, tuple)) else []
    ints = [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 0]
    if len(values) != 3 or len(ints) != 3 or sum(ints) < 1:
        raise InputError(
            "mrope_section must be three non-negative integers (temporal, height, width pairs) "
            f"with a positive sum, got {section!r}"
        )
    return ints[0], ints[1], ints[2]


def mrope_axes(section: Sequence[int], interleaved: bool = False) -> torch.Tensor:
    """The axis (0 temporal, 1 height, 2 width) whose position turns each rotated pair.

    Chunked (Qwen2-VL, arXiv:2409.12191, section 2.1): ``s_t`` temporal pairs, then ``s_h``
    height, then ``s_w`` width. Interleaved (Qwen3-VL; arXiv:2510.23095, MRoPE-Interleave):
    pair j is height when j = 1 (mod 3) and j < 3*s_h, width when j = 2 (mod 3) and j < 3*s_w,
    temporal otherwise; this gives each axis exactly its section's count only when
    3*s_h <= n + 1 and 3*s_w <= n (n = s_t + s_h + s_w), so other sections are refused.

    Args:
        section: ``(s_t, s_h, s_w)`` pairs per axis, non-negative, summing to n = rotary_dim/2.
        interleaved: Qwen3-VL's assignment (the configs' ``mrope_interleaved``).

    Returns:
        int64 tensor of shape ``(n,)`` with values in {0, 1, 2}.
    """
    s_t, s_h, s_w = _section(section)
    n = s_t + s_h + s_w
    if not isinstance(interleaved, bool):
        raise InputError(f"interleaved must be a bool, got {interleaved!r}")
    if not interleaved:
        return torch.repeat_interleave(torch.arange(3), torch.tensor([s_t, s_h, s_w]))
    if 3 * s_h > n + 1 or 3 * s_w > n:
        raise InputError(
            f"mrope_section={[s_t, s_h, s_w]} cannot be interleaved over {n} pairs: height takes "
            f"pairs 1, 4, 7, ... and width 2, 5, 8, ..., so allowed are 3*height <= {n + 1} and "
            f"3*width <= {n}"
        )
    axes = torch.zeros(n, dtype=torch.int64)
    axes[1 : 3 * s_h : 3] = 1
    axes[2 : 3 * s_w : 3] = 2
    return axes


def describe_mrope_axes(section: Sequence[int], interleaved: bool = False) -> str:
    """The pair -> axis assignment of :func:`mrope_axes` as one line of text.

    Examples: ``"pairs 0-15 temporal, 16-39 height, 40-63 width"`` for (16, 24, 24);
    ``"pairs 0-60 cycle temporal, height, width (pair j follows axis j mod 3), 61-63 temporal"``
    for (24, 20, 20) interleaved.
    """
    axes = mrope_axes(section, interleaved).tolist()
    parts = []
    start = 0
    if interleaved:
        cycle = 0
        while cycle < len(axes) and axes[cycle] == cycle % 3:
            cycle += 1
        if cycle > 3:
            parts.append(
                f"0-{cycle - 1} cycle temporal, height, width (pair j follows axis j mod 3)"
            )
            start = cycle
    j = start
    while j < len(axes):
        end = j
        while end + 1 < len(axes) and axes[end + 1] == axes[j]:
            end += 1
        span = str(j) if end == j else f"{j}-{end}"
        parts.append(f"{span} {AXES[axes[j]]}")
        j = end + 1
    return "pairs " + ", ".join(parts)


def _positions_3d(positions: object, name: str = "positions") -> torch.Tensor:
    """``(3, batch, seq)`` integer positions from the shapes transformers' Qwen2-VL text rotary
    accepts: ``(3, B, S)`` or ``(1, B, S)``, ``(B, S)`` and ``(S,)`` (text: all axes equal)."""
    pos = _checks.positions(positions, name=name)
    if pos.dim() == 1:
        pos = pos[None]
    if pos.dim() == 2:
        return pos[None].expand(3, -1, -1)
    if pos.dim() == 3 and pos.shape[0] in (1, 3):
        return pos.expand(3, -1, -1)
    hint = (
        f"; transformers' packed form (4, B, S) carries text positions in row 0: pass {name}[1:]"
        if pos.dim() == 3 and pos.shape[0] == 4
        else ""
    )
    raise InputError(
        f"{name} must have shape (3, batch, seq) (temporal, height, width), (batch, seq) or "
        f"(seq,), got shape {tuple(pos.shape)}{hint}"
    )


def axial_angles(
    positions: torch.Tensor, inv_freq: torch.Tensor, axes: torch.Tensor
) -> torch.Tensor:
    """Angles ``positions[axes[i]] * inv_freq[i]`` in float64, reduced into [0, 2*pi).

    The one formula of M-RoPE and of the vision tower's 2D RoPE: each pair i turns with the
    position along its own axis.

    Args:
        positions: integers of shape ``(A, *P)``, one row of positions per axis.
        inv_freq: ``(n,)`` frequency of each pair.
        axes: ``(n,)`` integers in ``[0, A)``, the axis of each pair.

    Returns:
        float64 tensor of shape ``P + (n,)`` on ``inv_freq``'s device.
    """
    n = inv_freq.shape[0] if inv_freq.dim() == 1 else -1
    if axes.dim() != 1 or axes.shape[0] != n:
        raise InputError(
            f"axes must have shape (n,) matching inv_freq's {tuple(inv_freq.shape)}, got "
            f"{tuple(axes.shape)}"
        )
    pos = _checks.positions(positions)
    if pos.dim() < 1:
        raise InputError("positions must have shape (axes, ...), got a scalar")
    if n and (int(axes.min()) < 0 or int(axes.max()) >= pos.shape[0]):
        raise InputError(
            f"axes must index the first dimension of positions (shape {tuple(pos.shape)}), "
            f"got values in [{int(axes.min())}, {int(axes.max())}]"
        )
    # All axes' angles, then each pair keeps its own axis: (A, *P, n) -> (*P, n). Forming the A
    # tables costs A times the memory of one, and keeps the product-and-reduce in freqs.angles.
    every = angles(pos, inv_freq)
    index = axes.to(every.device).view((1,) * (every.dim() - 1) + (n,))
    return every.gather(0, index.expand((1, *every.shape[1:]))).squeeze(0)


def _cos_sin(
    a: torch.Tensor, attention_factor: float, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    # The factor is applied in float64 so that the table is rounded once.
    cos, sin = torch.cos(a), torch.sin(a)
    if attention_factor != 1.0:
        cos, sin = cos * attention_factor, sin * attention_factor
    return cos.to(dtype=dtype, device=device), sin.to(dtype=dtype, device=device)


def mrope_angles(
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    section: Sequence[int],
    interleaved: bool = False,
) -> torch.Tensor:
    """M-RoPE angles p_axis(i) * theta_i in float64, reduced (arXiv:2409.12191, section 2.1).

    Args:
        positions: ``(3, batch, seq)`` temporal, height, width ids (``(1, batch, seq)``,
            ``(batch, seq)`` and ``(seq,)`` mean text: the same id on every axis), as
            :func:`mrope_position_ids` gives them.
        inv_freq: ``(n,)`` frequencies, n = rotary_dim/2; float64 for full precision.
        section: pairs per axis, summing to n (see :func:`mrope_axes`).
        interleaved: Qwen3-VL's assignment.

    Returns:
        float64 tensor of shape ``(batch, seq, n)`` on ``inv_freq``'s device.
    """
    freqs = _checks.float_tensor("inv_freq", inv_freq)
    axes = mrope_axes(section, interleaved)
    if freqs.dim() != 1 or freqs.shape[0] != axes.shape[0]:
        raise InputError(
            f"mrope_section {list(section)} covers {axes.shape[0]} pairs but inv_freq has shape "
            f"{tuple(freqs.shape)}; allowed are sections summing to rotary_dim/2 = len(inv_freq)"
        )
    return axial_angles(_positions_3d(positions), freqs, axes)


def mrope_cos_sin(
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    section: Sequence[int],
    interleaved: bool = False,
    *,
    attention_factor: float = 1.0,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token M-RoPE cos/sin tables, formed in float64 and cast once.

    The tables are what :func:`posemb.kernels.rotate` takes (``Layout.HALF``); transformers'
    Qwen2-VL/Qwen3-VL rotary returns the same numbers as ``cat((cos, cos), -1)``.

    Args:
        positions: ``(3, batch, seq)`` (or text shapes, see :func:`mrope_angles`).
        inv_freq: ``(n,)`` frequencies (a scaling's ``inv_freq``).
        section: ``(s_t, s_h, s_w)`` summing to n.
        interleaved: Qwen3-VL's assignment.
        attention_factor: multiplies cos and sin (a scaling's second result).
        dtype: output dtype.

    Returns:
        ``(cos, sin)``, each ``(batch, seq, n)`` of ``dtype`` on ``inv_freq``'s device.
    """
    _checks.float_dtype("dtype", dtype)
    factor = _checks.number("attention_factor", attention_factor, minimum=0.0, strict=True)
    a = mrope_angles(positions, inv_freq, section, interleaved)
    return _cos_sin(a, factor, dtype, inv_freq.device)


# --- 3D position ids for mixed text, images and videos -------------------------------------


def _grid(name: str, grid: object, merge: int) -> list[tuple[int, int, int]]:
    if grid is None:
        return []
    raw = grid.tolist() if isinstance(grid, torch.Tensor) else grid
    rows: list[tuple[int, int, int]] = []
    for r in raw if isinstance(raw, (list, tuple)) else [None]:
        vals = list(r) if isinstance(r, (list, tuple)) else []
        if len(vals) != 3 or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in vals
        ):
            raise InputError(
                f"{name} must be (num_items, 3) positive integers (t, h, w in patches), "
                f"got {grid!r}"
            )
        rows.append((vals[0], vals[1], vals[2]))
    for i, (t, h, w) in enumerate(rows):
        if h % merge or w % merge:
            raise InputError(
                f"{name}[{i}] = {[t, h, w]}: h and w must be divisible by "
                f"spatial_merge_size = {merge} (the merger joins {merge}x{merge} patches)"
            )
    return rows


def _runs(kinds: list[int]) -> list[tuple[int, int]]:
    """Maximal runs ``(kind, length)`` of equal values."""
    runs: list[tuple[int, int]] = []
    for kind in kinds:
        if runs and runs[-1][0] == kind:
            runs[-1] = (kind, runs[-1][1] + 1)
        else:
            runs.append((kind, 1))
    return runs


def mrope_position_ids(
    input_ids: torch.Tensor,
    *,
    image_token_id: int,
    video_token_id: int,
    image_grid_thw: torch.Tensor | Sequence[Sequence[int]] | None = None,
    video_grid_thw: torch.Tensor | Sequence[Sequence[int]] | None = None,
    attention_mask: torch.Tensor | None = None,
    spatial_merge_size: int = 2,
    vision_start_token_id: int | None = None,
    second_per_grid_ts: torch.Tensor | Sequence[float] | None = None,
    tokens_per_second: float | None = None,
    frames_apart: bool = False,
    text_after_vision: str = "max_plus_one",
) -> tuple[torch.Tensor, torch.Tensor]:
    """3D M-RoPE position ids of a batch of mixed text, images and videos, and the decode offsets.

    Qwen2-VL (arXiv:2409.12191, section 2.1): text tokens count up 0, 1, 2, ... on all three
    axes. An image or video of ``(t, h, w)`` patches fills ``t * (h/m) * (w/m)`` tokens (m the
    spatial merge size), frame by frame, row-major; each token gets ``(start + t_i, start + row,
    start + col)``. Qwen2.5-VL spaces a video's temporal ids by seconds:
    ``t_i = floor(i * second_per_grid_t * tokens_per_second)`` (computed in float64). Whatever
    follows resumes at the rule ``text_after_vision`` names:

    - ``"max_plus_one"``: one past the largest id used so far, the paper's rule and that of
      Qwen's reference code and transformers 4.x.
    - ``"spatial"``: ``start + max(h, w)/m``, what transformers 5.x computes. The two agree for
      images and for videos whose temporal ids stay below ``start + max(h, w)/m``; for longer
      videos transformers 5.x puts the following text at ids the video already used.

    The image/video tokens of each sequence are the runs of ``image_token_id``/``video_token_id``
    among the tokens ``attention_mask`` keeps; rows of the grids are used in order across the
    batch, each taking as many tokens as it fills (adjacent items split correctly).

    Args:
        input_ids: ``(batch, seq)`` token ids.
        image_token_id: the placeholder token that stands for an image patch.
        video_token_id: the same, for a video patch.
        image_grid_thw: ``(num_images, 3)`` (t, h, w) in patches before merging.
        video_grid_thw: ``(num_videos, 3)``.
        attention_mask: ``(batch, seq)``, 1 for tokens, 0 for padding (which gets id 0).
        spatial_merge_size: m, patches merged per side into one token.
        vision_start_token_id: when given, the number of these tokens must equal the number of
            images and videos (frames, with ``frames_apart``): a check on the grids.
        second_per_grid_ts: ``(num_videos,)`` seconds per temporal patch (Qwen2.5-VL); default 1.
        tokens_per_second: Qwen2.5-VL's temporal ids per second; None for Qwen2-VL (step 1).
        frames_apart: Qwen3-VL/Qwen3.5: each video frame is its own item with t = 1 (frames are
            separated by timestamp text), so a video row stands for t items.
        text_after_vision: one of :data:`TEXT_AFTER_VISION`.

    Returns:
        ``(position_ids, rope_deltas)``: int64 ``(3, batch, seq)`` and ``(batch, 1)``, where
        ``rope_deltas[b] = max id + 1 - tokens`` of sequence b: a decode step at cache length L
        has position ``L + rope_deltas[b]`` on every axis.
    """
    ids = _checks.positions(input_ids, name="input_ids")
    if ids.dim() != 2:
        raise InputError(f"input_ids must have shape (batch, seq), got {tuple(ids.shape)}")
    keep = _kept(ids, attention_mask)
    merge = _checks.positive_int("spatial_merge_size", spatial_merge_size)
    for name, tok in (("image_token_id", image_token_id), ("video_token_id", video_token_id)):
        if isinstance(tok, bool) or not isinstance(tok, int):
            raise InputError(f"{name} must be an int, got {tok!r}")
    if image_token_id == video_token_id:
        raise InputError(f"image_token_id and video_token_id must differ, got {image_token_id}")
    if text_after_vision not in TEXT_AFTER_VISION:
        raise InputError(
            f"text_after_vision must be one of {', '.join(TEXT_AFTER_VISION)}, "
            f"got {text_after_vision!r}"
        )
    images = _grid("image_grid_thw", image_grid_thw, merge)
    videos = _grid("video_grid_thw", video_grid_thw, merge)
    steps = _video_steps(len(videos), second_per_grid_ts, tokens_per_second)
    items = _Items(
        {
            1: [(t, h // merge, w // merge, 1.0) for t, h, w in images],
            2: _video_items(videos, steps, merge, frames_apart),
        },
        (image_token_id, video_token_id),
        merge,
        frames_apart,
    )
    batch, seq = ids.shape
    out = torch.zeros(3, batch, seq, dtype=torch.int64)
    deltas = torch.zeros(batch, 1, dtype=torch.int64)
    starts = 0
    for b in range(batch):
        tokens = ids[b].cpu()[keep[b]].tolist()
        if vision_start_token_id is not None:
            starts += tokens.count(vision_start_token_id)
        pos = items.positions(tokens, b, text_after_vision)
        if pos is not None:
            out[:, b, keep[b]] = pos
            deltas[b, 0] = int(pos.max()) + 1 - len(tokens)
    items.check_all_used()
    used = items.used
    if vision_start_token_id is not None and starts != used[1] + used[2]:
        raise InputError(
            f"image_grid_thw and video_grid_thw describe {used[1]} images and {used[2]} videos"
            f"{' (frames)' if frames_apart else ''} but input_ids hold {starts} vision_start "
            f"tokens (vision_start_token_id={vision_start_token_id}); allowed: one per item"
        )
    return out.to(ids.device), deltas.to(ids.device)


def _kept(ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """The tokens ``attention_mask`` keeps, ``(batch, seq)`` bool on the CPU."""
    if attention_mask is None:
        return torch.ones(ids.shape, dtype=torch.bool)
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != ids.shape:
        got = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else None
        raise InputError(
            f"attention_mask must be a tensor of input_ids' shape {tuple(ids.shape)}, got {got}"
        )
    return attention_mask.bool().cpu()


def _video_steps(
    videos: int,
    second_per_grid_ts: torch.Tensor | Sequence[float] | None,
    tokens_per_second: float | None,
) -> list[float]:
    """Each video's temporal id step: seconds per temporal patch times ids per second
    (Qwen2.5-VL), 1 without ``tokens_per_second`` (Qwen2-VL)."""
    if tokens_per_second is None:
        if second_per_grid_ts is not None:
            raise InputError(
                "second_per_grid_ts needs tokens_per_second (Qwen2.5-VL's "
                "vision_config.tokens_per_second); pass both or neither"
            )
        tps = 1.0
    else:
        tps = _checks.number("tokens_per_second", tokens_per_second, minimum=0.0)
    if second_per_grid_ts is None:
        return [tps] * videos
    raw = (
        second_per_grid_ts.tolist()
        if isinstance(second_per_grid_ts, torch.Tensor)
        else list(second_per_grid_ts)
    )
    if len(raw) != videos:
        raise InputError(
            f"second_per_grid_ts must have one value per video ({videos}), got {len(raw)}"
        )
    return [_checks.number("second_per_grid_ts", s, minimum=0.0) * tps for s in raw]


def _video_items(
    videos: list[tuple[int, int, int]], steps: list[float], merge: int, frames_apart: bool
) -> list[tuple[int, int, int, float]]:
    """(t, h/m, w/m, temporal step) per video item: one per frame with ``frames_apart``."""
    out: list[tuple[int, int, int, float]] = []
    for (t, h, w), step in zip(videos, steps, strict=True):
        if frames_apart:
            out += [(1, h // merge, w // merge, 1.0)] * t
        else:
            out.append((t, h // merge, w // merge, step))
    return out


class _Items:
    """The images (kind 1) and videos (kind 2) of a batch, used in order across it."""

    NAMES: ClassVar[dict[int, str]] = {1: "image", 2: "video"}
    GRIDS: ClassVar[dict[int, str]] = {1: "image_grid_thw", 2: "video_grid_thw"}

    def __init__(
        self,
        queues: dict[int, list[tuple[int, int, int, float]]],
        token_ids: tuple[int, int],
        merge: int,
        frames_apart: bool,
    ) -> None:
        self.queues, self.token_ids, self.merge = queues, token_ids, merge
        self.frames = " (frames)" if frames_apart else ""
        self.used = {1: 0, 2: 0}

    def _next(self, kind: int, left: int, b: int) -> tuple[int, int, int, float]:
        name, grid, queue = self.NAMES[kind], self.GRIDS[kind], self.queues[kind]
        if self.used[kind] == len(queue):
            raise InputError(
                f"{grid} describes {len(queue)} {name}s{self.frames if kind == 2 else ''} but "
                f"input_ids hold more {name} tokens ({name}_token_id="
                f"{self.token_ids[kind - 1]}) in sequence {b}"
            )
        t, gh, gw, step = queue[self.used[kind]]
        if t * gh * gw > left:
            raise InputError(
                f"{grid} row for {name} {self.used[kind]} fills {t * gh * gw} tokens "
                f"(t*h*w/{self.merge}^2) but sequence {b} has a run of only {left} {name} "
                f"tokens there"
            )
        self.used[kind] += 1
        return t, gh, gw, step

    def positions(self, tokens: list[int], b: int, text_after_vision: str) -> torch.Tensor | None:
        """``(3, len(tokens))`` ids of one sequence's kept tokens (None when it has none)."""
        image, video = self.token_ids
        kinds = [1 if x == image else 2 if x == video else 0 for x in tokens]
        pieces: list[torch.Tensor] = []
        nxt = 0  # where the next item's numbering starts
        for kind, length in _runs(kinds):
            if kind == 0:
                pieces.append(torch.arange(nxt, nxt + length).expand(3, -1))
                nxt += length
                continue
            left = length
            while left:
                t, gh, gw, step = self._next(kind, left, b)
                # float64 so that a step like 0.5 s * 2 tokens/s is exact before the floor.
                tt = torch.floor(torch.arange(t, dtype=torch.float64) * step).long()
                grid_t, grid_h, grid_w = torch.meshgrid(
                    tt, torch.arange(gh), torch.arange(gw), indexing="ij"
                )
                item = torch.stack((grid_t, grid_h, grid_w)).reshape(3, -1) + nxt
                pieces.append(item)
                nxt = (
                    int(item.max()) + 1
                    if text_after_vision == "max_plus_one"
                    else nxt + max(gh, gw)
                )
                left -= t * gh * gw
        return torch.cat(pieces, dim=1) if pieces else None

    def check_all_used(self) -> None:
        for kind in (1, 2):
            if self.used[kind] != len(self.queues[kind]):
                raise InputError(
                    f"{self.GRIDS[kind]} describes {len(self.queues[kind])} {self.NAMES[kind]}s"
                    f"{self.frames if kind == 2 else ''} but input_ids hold tokens for "
                    f"{self.used[kind]}"
                )


# --- 2D RoPE of the vision tower -----------------------------------------------------------


def vision_patch_positions(
    grid_thw: torch.Tensor | Sequence[Sequence[int]], spatial_merge_size: int = 2
) -> torch.Tensor:
    """(row, column) of every patch, in the order the Qwen2-VL vision tower holds them.

    The patch merger joins each m x m block of neighbouring patches into one LLM token, so the
    tower orders patches block by block (blocks row-major, patches row-major inside a block);
    each of a video's t temporal patches repeats the frame's positions.

    Args:
        grid_thw: ``(num_items, 3)`` (t, h, w) in patches; h and w divisible by m.
        spatial_merge_size: m.

    Returns:
        int64 tensor of shape ``(sum t*h*w, 2)``: row, column.
    """
    merge = _checks.positive_int("spatial_merge_size", spatial_merge_size)
    device = grid_thw.device if isinstance(grid_thw, torch.Tensor) else None
    pieces = []
    for t, h, w in _grid("grid_thw", grid_thw, merge):
        # (h/m, w/m, m, m): block row, block column, row in block, column in block.
        bh, bw, ih, iw = torch.meshgrid(
            torch.arange(h // merge),
            torch.arange(w // merge),
            torch.arange(merge),
            torch.arange(merge),
            indexing="ij",
        )
        rc = torch.stack(((bh * merge + ih).flatten(), (bw * merge + iw).flatten()), dim=-1)
        pieces.append(rc.repeat(t, 1))
    if not pieces:
        return torch.zeros(0, 2, dtype=torch.int64, device=device)
    return torch.cat(pieces).to(device)


def vision_axes(head_dim: int) -> torch.Tensor:
    """Axis of each pair of the vision tower's 2D RoPE: 0 (row) for the first head_dim/4 pairs,
    1 (column) for the rest; int64 ``(head_dim // 2,)``."""
    _checks.positive_int("head_dim", head_dim)
    if head_dim % 4:
        raise InputError(
            f"head_dim must be a multiple of 4 (row and column pairs), got {head_dim!r}"
        )
    return torch.repeat_interleave(torch.arange(2), head_dim // 4)


def vision_cos_sin(
    patch_positions: torch.Tensor,
    head_dim: int,
    base: float = 10000.0,
    *,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-patch cos/sin of the Qwen2-VL vision tower's 2D RoPE, formed in float64.

    Pair i < head_dim/4 turns by ``row * theta_i`` and pair head_dim/4 + i by ``col * theta_i``,
    with ``theta_i = base^(-2i/(head_dim/2))`` (a ladder over half the head: each axis gets the
    full range of frequencies). All head_dim channels rotate, ``Layout.HALF``.

    Args:
        patch_positions: ``(N, 2)`` integer (row, column), e.g. :func:`vision_patch_positions`.
        head_dim: channels per head; a multiple of 4.
        base: frequency base (10000 in Qwen2-VL).
        dtype: output dtype.

    Returns:
        ``(cos, sin)``, each ``(N, head_dim // 2)``, on ``patch_positions``' device.
    """
    pos = _checks.positions(patch_positions, name="patch_positions")
    if pos.dim() != 2 or pos.shape[1] != 2:
        raise InputError(
            f"patch_positions must have shape (N, 2) (row, column), got {tuple(pos.shape)}"
        )
    _checks.float_dtype("dtype", dtype)
    axes = vision_axes(head_dim)
    ladder = _inv_freq(head_dim // 2, base, dtype=torch.float64, device=pos.device)
    a = axial_angles(pos.T, ladder.repeat(2), axes)
    return _cos_sin(a, 1.0, dtype, pos.device)


# --- module --------------------------------------------------------------------------------


class MRotaryEmbedding(nn.Module):
    """Rotates queries and keys by 3D (temporal, height, width) positions: M-RoPE.

    Qwen2-VL / Qwen2.5-VL (chunked sections) and Qwen3-VL / Qwen3.5 (``interleaved=True``,
    partial ``rotary_dim``); see :mod:`posemb.mrope`. No parameters, no state.

    Args:
        head_dim: channels per head of q and k.
        base: frequency base (Qwen2-VL: 1e6).
        mrope_section: ``(s_t, s_h, s_w)`` pairs per axis, summing to rotary_dim/2.
        interleaved: Qwen3-VL's pair -> axis assignment.
        rotary_dim: channels that rotate (the first ones); even, <= head_dim; default all.
        scaling: a :mod:`posemb.scaling` object; default :class:`posemb.scaling.Default`.
        backend: how to rotate: "auto", "reference", "cpu" or "triton" (:mod:`posemb.kernels`).
    """

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        mrope_section: Sequence[int] = (16, 24, 24),
        interleaved: bool = False,
        rotary_dim: int | None = None,
        scaling: _scaling.RopeScaling | None = None,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        self.head_dim, self.rotary_dim = _checks.rotary_dims(head_dim, rotary_dim)
        self.base = _checks.base(base)
        self.mrope_section = _section(mrope_section)
        self.interleaved = interleaved
        axes = mrope_axes(self.mrope_section, interleaved)
        if axes.shape[0] != self.rotary_dim // 2:
            raise InputError(
                f"mrope_section {list(self.mrope_section)} covers {axes.shape[0]} pairs; allowed "
                f"are sections summing to rotary_dim/2 = {self.rotary_dim // 2}"
            )
        self.scaling = _scaling.check(scaling)
        if backend not in kernels.BACKENDS:
            raise InputError(
                f"backend must be one of {', '.join(kernels.BACKENDS)}, got {backend!r}"
            )
        self.backend = backend
        if backend in ("auto", "cpu"):
            # Load (or build) the CPU kernel now, not inside a forward torch.compile may trace.
            kernels.cpu.load()

    @property
    def scaling(self) -> _scaling.RopeScaling:
        """The context-extension schedule; None sets the default; checked when set."""
        return self._scaling

    @scaling.setter
    def scaling(self, value: _scaling.RopeScaling | None) -> None:
        self._scaling = _scaling.check(value)

    def __setstate__(self, state: dict[str, object]) -> None:
        if "scaling" in state:  # pickled before scaling became a property
            state["_scaling"] = state.pop("scaling")
        super().__setstate__(state)

    def describe(self) -> str:
        """The pair -> axis assignment as text (:func:`describe_mrope_axes`)."""
        return describe_mrope_axes(self.mrope_section, self.interleaved)

    def cos_sin(
        self,
        positions: torch.Tensor,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Cos and sin for 3D positions, the scaling's attention factor applied.

        Args:
            positions: ``(3, batch, seq)``; ``(batch, seq)`` or ``(seq,)`` for text.
            dtype: output dtype.
            device: output device; default that of ``positions``.

        Returns:
            ``(cos, sin)``, each ``(batch, seq, rotary_dim // 2)`` (batch 1 for ``(seq,)``).
        """
        pos = _positions_3d(positions)
        dev = torch.device(device) if device is not None else pos.device
        seq_len = None
        if self.scaling.depends_on_length and pos.numel():
            # As transformers' dynamic update: the length is the largest id + 1 on any axis.
            seq_len = int(pos.max()) + 1
        inv, factor = _scaling.cached_compute(
            self.scaling, self.rotary_dim, self.base, dev, seq_len
        )
        return mrope_cos_sin(
            pos, inv, self.mrope_section, self.interleaved, attention_factor=factor, dtype=dtype
        )

    def _check(self, name: str, x: object) -> torch.Tensor:
        return _checks.heads_tensor(name, x, self.head_dim)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor | None = None,
        inplace: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate queries and keys at the same 3D positions.

        Args:
            q: ``(batch, q_heads, seq, head_dim)``, unit stride in head_dim.
            k: ``(batch, kv_heads, seq, head_dim)``; kv_heads may differ (GQA).
            positions: ``(3, 1 or batch, seq)`` (e.g. :func:`mrope_position_ids`), or
                ``(seq,)`` / ``(1 or batch, seq)`` for text; default ``0 .. seq-1``.
            inplace: rotate in q's and k's own memory (inference only).

        Returns:
            ``(q, k)`` rotated, shapes and dtypes kept.
        """
        q = self._check("q", q)
        k = self._check("k", k)
        if k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
            raise InputError(
                f"q and k must share batch and seq (they sit at the same positions), got "
                f"q {tuple(q.shape)} and k {tuple(k.shape)}"
            )
        batch, seq = q.shape[0], q.shape[2]
        if positions is None:
            pos = torch.arange(seq, device=q.device)
        else:
            pos = _positions_3d(positions)
            if pos.shape[2] != seq or pos.shape[1] not in (1, batch):
                raise InputError(
                    f"positions must cover (3, {batch} or 1, {seq}) for q of shape "
                    f"{tuple(q.shape)}, got {tuple(pos.shape)}"
                )
        cos, sin = self.cos_sin(pos, dtype=_checks.compute_dtype(q), device=q.device)
        return kernels.rotate(q, k, cos, sin, backend=self.backend, inplace=inplace)

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base:g}, "
            f"mrope_section={list(self.mrope_section)}, interleaved={self.interleaved}, "
            f"scaling={self.scaling!r}, backend={self.backend!r}"
        )


__all__ = [
    "AXES",
    "TEXT_AFTER_VISION",
    "MRotaryEmbedding",
    "axial_angles",
    "describe_mrope_axes",
    "mrope_angles",
    "mrope_axes",
    "mrope_cos_sin",
    "mrope_position_ids",
    "vision_axes",
    "vision_cos_sin",
    "vision_patch_positions",
]
