#!/usr/bin/env python3
"""Train the learned position table the parchment figure draws, and ship it.

Runs :func:`posemb.lesson.parchment.train_learned_table` (a lab TinyLM with the learned encoding,
seeded, CPU, about a minute on two cores) and writes ``src/posemb/lesson/data/parchment_wpos.json``
atomically. Run from the repository root after a change to the lab model or the training loop::

    python scripts/make_parchment_table.py
"""

from __future__ import annotations

import time
from pathlib import Path

from posemb._io import atomic_write_bytes
from posemb.lesson import parchment

OUT = Path(__file__).resolve().parents[1] / "src" / "posemb" / "lesson" / parchment.TABLE_FILE


def main() -> None:
    start = time.perf_counter()
    table = parchment.train_learned_table()
    atomic_write_bytes(OUT, parchment.table_json(table))
    print(
        f"wrote {OUT} in {time.perf_counter() - start:.0f} s: final loss "
        f"{table.info['final_loss']:.3f} nats/char (unigram {table.info['unigram_entropy']:.3f}), "
        f"neighbour correlation {parchment.neighbour_correlation(table.weight):.2f}"
    )


if __name__ == "__main__":
    main()
