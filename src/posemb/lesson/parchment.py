"""The lesson's closing figure: sinusoidal against learned absolute embeddings, on parchment.

The seed lesson's last screen describes one square figure in detail (cream #fcf0db, a sepia
frame, a navy serif title and subtitle, the sinusoidal formula and its harmonics on the left, a
learned ``W_pos`` strip on the right, the fusion formula at the bottom). :func:`draw_parchment`
draws it with matplotlib from posemb's own data:

- left: ``posemb.sinusoidal_table`` sampled at integer positions (dots) on the continuous waves of
  wavelength ``posemb.wavelengths`` (lines), for a few channel pairs from fast to glacial;
- right: the position table of a lab :class:`~posemb.lab.model.TinyLM` trained with the learned
  encoding on the lab's corpus. Training it until its rows become smooth takes about a minute,
  too long for every page build, so :func:`train_learned_table` ran once through
  ``scripts/make_parchment_table.py`` and its result ships as ``lesson/data/parchment_wpos.json``
  (with the configuration, seed and final loss that made it).

The texts the seed prescribes are kept verbatim (:data:`TITLE`, :data:`SUBTITLE`, the formulas);
sub- and superscripts are written with Unicode and ``^( )`` so that the SVG keeps each formula as
one searchable ``<text>`` element instead of one glyph per element as mathtext would.
"""

from __future__ import annotations

import io
import json
import math
import os
from dataclasses import asdict, dataclass, replace
from importlib import resources
from typing import TYPE_CHECKING, Any

import torch

from .._errors import InputError
from .._io import atomic_write_bytes
from ..absolute import LearnedEmbedding, sinusoidal_table
from ..freqs import wavelengths

if TYPE_CHECKING:
    from ..lab.model import TinyLM

TITLE = "Positional Embeddings: Injecting Sequence Order"
SUBTITLE = "Why Transformers are permutation-invariant and how positional vectors restore order."
SINE_FORMULA = "PE(pos, 2i) = sin(pos / 10000^(2i/d))"
COSINE_FORMULA = "PE(pos, 2i+1) = cos(pos / 10000^(2i/d))"
TABLE_FORMULA = "Wₚₒₛ ∈ ℝ^(Lₘₐₓ × D)"
FUSION_LABEL = "Input Representation = Token Embedding + Positional Embedding"
FUSION_FORMULA = "xₜ = Wₜₒₖₑₙ[idₜ] + Wₚₒₛ[t]"
TEXTS = (TITLE, SUBTITLE, SINE_FORMULA, COSINE_FORMULA, TABLE_FORMULA, FUSION_LABEL, FUSION_FORMULA)
"""Every text the seed prescribes, as the SVG holds it."""

CREAM = "#fcf0db"
SEPIA = "#704214"
NAVY = "#1b2a4a"
INK = "#3b2a1a"  # body text: a dark sepia, softer than black on cream

SIZE_IN = 8.0  # square figure, inches
DPI = 150  # PNG: 1200 x 1200 pixels
WAVE_DIM = 64  # the sinusoidal panel uses the learned table's width, so the panels compare
WAVE_PAIRS = (0, 2, 4, 8, 16)  # channel pairs i: wavelengths ~6 to ~630 positions at d = 64
TABLE_FILE = "data/parchment_wpos.json"

# The learned table's model and run (scripts/make_parchment_table.py). Weight decay 0: the
# figure shows what training put in the table, not a table shrunk toward zero.
TABLE_MODEL = {"width": 64, "layers": 2, "heads": 4, "train_len": 64, "max_len": 64}


@dataclass(frozen=True)
class TableRun:
    """How the shipped table was trained (batches of ``batch`` windows of ``train_len`` chars)."""

    steps: int = 1500
    batch: int = 16
    lr: float = 3e-3
    weight_decay: float = 0.0
    seed: int = 0


TABLE_RUN = TableRun()


@dataclass(frozen=True)
class LearnedTable:
    """A trained position table ``weight (max_len, width)`` and how it was made (``info``)."""

    weight: torch.Tensor
    info: dict[str, Any]


def _initial_model(vocab: int, seed: int) -> TinyLM:
    """The untrained lab model the table starts from (same seed, same draws every time)."""
    from ..lab.model import ModelConfig, TinyLM

    # Seed a forked generator: the caller's global random state is left as it was.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return TinyLM(ModelConfig(vocab=vocab, encoding="learned", **TABLE_MODEL))


def _table_of(model: TinyLM) -> torch.Tensor:
    """A copy of the learned model's position table ``(max_len, width)``."""
    if not isinstance(model.input_pos, LearnedEmbedding):
        raise InputError(f"model must use the learned encoding, got {model.cfg.encoding!r}")
    return model.input_pos.weight.detach().clone()


def initial_table(vocab: int, seed: int = TABLE_RUN.seed) -> torch.Tensor:
    """The position table before training: ``(max_len, width)``, N(0, 0.02^2) draws."""
    return _table_of(_initial_model(vocab, seed))


def train_learned_table(steps: int = TABLE_RUN.steps, seed: int = TABLE_RUN.seed) -> LearnedTable:
    """Train a lab :class:`~posemb.lab.model.TinyLM` with a learned position table on the lab's
    default corpus (next-character prediction, the lab's one training loop) and return the table.

    Deterministic for a given machine: seeded initialisation and batches, CPU. About 35 ms a step
    on two cores; the shipped table took :data:`TABLE_RUN` ``.steps`` steps.

    Args:
        steps: optimizer steps (warm-up then cosine decay over them).
        seed: seeds the initialisation and the batch draws.

    Returns:
        The trained ``weight (max_len, width)`` and ``info`` (configuration, seed, final loss).
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise InputError(f"steps must be an int >= 1, got {steps!r}")
    from ..lab import corpus
    from ..lab.train import adamw, next_token, train, warmup_cosine, windows

    data = corpus.load()
    model = _initial_model(len(data.vocab), seed)
    gen = torch.Generator().manual_seed(seed)
    length, batch, lr = TABLE_MODEL["train_len"], TABLE_RUN.batch, TABLE_RUN.lr
    loss = train(
        model,
        adamw(model, lr, TABLE_RUN.weight_decay),
        lambda _: next_token(windows(data.train, length, batch, gen)),
        steps,
        lambda s: warmup_cosine(s, steps, lr),
    )
    info = {
        "corpus": data.name,
        "vocab": len(data.vocab),
        "model": dict(TABLE_MODEL),
        "run": asdict(replace(TABLE_RUN, steps=steps, seed=seed)),
        "final_loss": loss,
        "unigram_entropy": data.unigram_entropy(),
        "torch": torch.__version__,
    }
    return LearnedTable(_table_of(model), info)


def table_json(table: LearnedTable) -> bytes:
    """The shipped file's bytes: ``info`` plus the table rounded to 5 decimals (the figure's
    colours cannot show more; init values are ~0.02, trained ones ~0.1-1)."""
    rows = [[round(v, 5) for v in row] for row in table.weight.tolist()]
    return (json.dumps({**table.info, "weight": rows}, indent=None) + "\n").encode()


def learned_table() -> LearnedTable:
    """The trained table that ships with posemb: ``weight (64, 64)`` float32 and its ``info``."""
    raw = json.loads(resources.files("posemb.lesson").joinpath(TABLE_FILE).read_text())
    weight = torch.tensor(raw.pop("weight"), dtype=torch.float32)
    return LearnedTable(weight, raw)


def neighbour_correlation(weight: torch.Tensor, offset: int = 1) -> float:
    """Mean cosine between rows ``t`` and ``t + offset`` of ``weight (L, D)`` after removing the
    mean row: near 1 for a smooth table, near 0 for independent noise."""
    if not 1 <= offset < weight.shape[0]:
        raise InputError(f"offset must be in [1, {weight.shape[0] - 1}], got {offset!r}")
    centred = torch.nn.functional.normalize(weight - weight.mean(0), dim=1)
    return float((centred[:-offset] * centred[offset:]).sum(1).mean())


def _waves(ax: Any, dim: int, length: int) -> None:
    """Offset sine channels ``PE[:, 2i]`` for :data:`WAVE_PAIRS`: table samples on their waves."""
    table = sinusoidal_table(length, dim, dtype=torch.float64)  # (length, dim)
    lam = wavelengths(dim)  # (dim/2,) positions per turn of each pair
    fine = torch.linspace(0, length - 1, 8 * length, dtype=torch.float64)
    for row, i in enumerate(WAVE_PAIRS):
        y0 = -2.6 * row
        wave = torch.sin(2 * math.pi * fine / lam[i])
        ax.plot(fine, y0 + wave, color=NAVY, lw=1.3, alpha=0.85)
        ax.plot(torch.arange(length), y0 + table[:, 2 * i], "o", ms=2.0, color=SEPIA)
        ax.text(
            length + 1,
            y0,
            f"2i = {2 * i}\nλ = {float(lam[i]):.1f}",
            va="center",
            ha="left",
            fontsize=8,
            color=INK,
            family="serif",
        )
    ax.set_xlim(-1, length)
    ax.set_ylim(-2.6 * (len(WAVE_PAIRS) - 1) - 1.4, 1.4)
    ax.set_yticks([])
    ax.set_xlabel("position pos", family="serif", color=INK, fontsize=9)


def _strip(fig: Any, ax: Any, weight: torch.Tensor) -> None:
    """The learned table ``(L, D)`` as a heatmap with positions across, like the waves beside it:
    column t is the row ``W_pos[t]``."""
    from matplotlib.colors import LinearSegmentedColormap

    length, width = weight.shape
    cmap = LinearSegmentedColormap.from_list("parchment", [NAVY, CREAM, SEPIA])
    # Clip at the 99th percentile: position 0's row is several times larger than the rest (the
    # model marks the first position), and a full-range scale would wash the others out.
    lim = float(weight.abs().quantile(0.99))
    image = ax.imshow(
        weight.T.numpy(), cmap=cmap, vmin=-lim, vmax=lim, aspect="auto", interpolation="nearest"
    )
    ticks = list(range(0, length - length // 5, max(1, length // 4)))
    ax.set_xticks([*ticks, length - 1], [*map(str, ticks), f"L−1 = {length - 1}"])
    ax.set_xlabel("position t (row t of Wₚₒₛ)", family="serif", color=INK, fontsize=9)
    ax.set_ylabel(f"dimension (D = {width})", family="serif", color=INK, fontsize=9)
    bar = fig.colorbar(image, ax=ax, fraction=0.05, pad=0.02)
    bar.ax.tick_params(labelsize=7, colors=INK)
    bar.outline.set_edgecolor(SEPIA)


def _style(ax: Any) -> None:
    ax.set_facecolor(CREAM)
    for spine in ax.spines.values():
        spine.set_color(SEPIA)
    ax.tick_params(colors=INK, labelsize=8)


def _figure(table: LearnedTable) -> Any:
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    fig = Figure(figsize=(SIZE_IN, SIZE_IN), dpi=DPI, facecolor=CREAM)
    # The frame: a heavy sepia rule with a hairline inside it, clear of the edges so the
    # background shows on every side.
    for inset, width in ((0.02, 3.0), (0.03, 0.8)):
        fig.add_artist(
            Rectangle(
                (inset, inset),
                1 - 2 * inset,
                1 - 2 * inset,
                transform=fig.transFigure,
                fill=False,
                edgecolor=SEPIA,
                linewidth=width,
            )
        )
    serif: dict[str, Any] = {"family": "serif"}
    fig.text(0.5, 0.925, TITLE, ha="center", color=NAVY, fontsize=18, weight="bold", **serif)
    fig.text(0.5, 0.89, SUBTITLE, ha="center", color=INK, fontsize=10.5, style="italic", **serif)

    length, width = table.weight.shape
    head: dict[str, Any] = {
        "ha": "center",
        "color": NAVY,
        "fontsize": 12.5,
        "weight": "bold",
        **serif,
    }
    body: dict[str, Any] = {"ha": "center", "color": INK, "fontsize": 9.5, **serif}
    fig.text(0.27, 0.83, "Sinusoidal (Vaswani et al. 2017)", **head)
    fig.text(0.27, 0.80, SINE_FORMULA, **body)
    fig.text(0.27, 0.775, COSINE_FORMULA, **body)
    fig.text(0.74, 0.83, "Learned (GPT-2 / GPT-3)", **head)
    fig.text(0.74, 0.80, TABLE_FORMULA, **body)
    fig.text(0.74, 0.775, "one trained vector per position 0, 1, …, L−1", **body)

    left = fig.add_axes((0.08, 0.22, 0.33, 0.52))
    _style(left)
    _waves(left, width, length)
    right = fig.add_axes((0.575, 0.22, 0.33, 0.52))
    _style(right)
    _strip(fig, right, table.weight)

    note: dict[str, Any] = {
        "ha": "center",
        "va": "top",
        "color": INK,
        "fontsize": 7.5,
        "style": "italic",
        **serif,
    }
    fig.text(
        0.27,
        0.165,
        f"dots: posemb.sinusoidal_table({length}, {width})\nwaves: posemb.wavelengths({width})",
        **note,
    )
    run = table.info.get("run", {})
    fig.text(
        0.74,
        0.165,
        f"trained: posemb lab TinyLM (learned encoding)\n{run.get('steps', '?')} steps on the "
        f"lab corpus '{table.info.get('corpus')}'",
        **note,
    )
    fig.text(0.5, 0.098, FUSION_LABEL, ha="center", color=NAVY, fontsize=11.5, **serif)
    fig.text(0.5, 0.06, FUSION_FORMULA, ha="center", color=NAVY, fontsize=14, **serif)
    return fig


def draw_parchment(
    out_dir: str | os.PathLike[str], table: LearnedTable | None = None
) -> tuple[str, str]:
    """Draw the parchment figure into ``out_dir`` as ``parchment.png`` and ``parchment.svg``.

    Both files are written atomically; the same inputs give the same bytes (fixed SVG ids and
    no dates in the metadata).

    Args:
        out_dir: folder to write into (created if missing).
        table: the learned table to draw; default the one that ships (:func:`learned_table`).

    Returns:
        ``(png_path, svg_path)``.
    """
    import matplotlib as mpl

    if table is None:
        table = learned_table()
    if table.weight.dim() != 2:
        raise InputError(
            f"table.weight must be (positions, width), got {tuple(table.weight.shape)}"
        )
    out = os.fspath(out_dir)
    if os.path.exists(out) and not os.path.isdir(out):
        raise InputError(f"out_dir must be a folder, got the file {out!r}")
    paths = (os.path.join(out, "parchment.png"), os.path.join(out, "parchment.svg"))
    # svg.fonttype 'none' keeps text as <text>; a fixed hashsalt makes the SVG ids repeatable.
    with mpl.rc_context(
        {"svg.fonttype": "none", "svg.hashsalt": "posemb-parchment", "font.family": "serif"}
    ):
        fig = _figure(table)
        blobs = []
        for fmt, meta in (("png", {"Software": None}), ("svg", {"Date": None, "Creator": None})):
            buf = io.BytesIO()
            fig.savefig(buf, format=fmt, facecolor=CREAM, metadata=meta)
            blobs.append(buf.getvalue())
    for path, data in zip(paths, blobs, strict=True):
        atomic_write_bytes(path, data)
    return paths
