"""Mutated copies of the published configs into ``posemb inspect``, under a memory limit.

Each mutation drops, renames or retypes one key of a config in ``tests/data/hf_configs``, or
(one in three) sets a size (head width, head counts, layers, positions, a window) to an absurd
value. ``posemb inspect`` (its transformers check included) must end each in exit status 0,
or 2 with one line, within seconds, in a process whose address space is limited (4 GB by
default): a door that allocates what an absurd size asks for fails with ``MemoryError`` or
torch's allocation error here instead of swapping a machine to a halt.

Usage: python scripts/fuzz_configs.py [--mutations N] [--seed S] [--limit-gb G] [--json]
Exit status 0 when every mutation ended as it must; 1 with the first few that did not.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import pathlib
import random
import resource
import signal
import sys
import time
from collections.abc import Iterator

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "hf_configs"
WEIRD = [None, -1, 0, 1, 3, 7, 2.5, -0.5, 1e308, float("nan"), "64", "x", True, [], [1, 2], {}]
# Keys that size something (a table, a list per layer, a window) and values no model has.
SIZE_KEYS = (
    "hidden_size", "head_dim", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
    "max_position_embeddings", "original_max_position_embeddings", "sliding_window",
    "intermediate_size", "vocab_size", "rotary_dim", "qk_rope_head_dim", "n_heads", "dim",
    "n_layers", "attention_chunk_size", "global_head_dim", "num_local_experts", "n_positions",
    "n_ctx", "n_layer", "n_head",
)  # fmt: skip
# Past every bound, and between (2^20, 2^24: accepted lengths that a module tabulating every
# position would turn into gigabytes).
ABSURD = [1 << 20, 1 << 24, 1 << 31, 1 << 40, 1 << 53, (1 << 63) - 1, 1 << 64, 10**30, 1e300]


def _paths(d: dict, prefix: tuple = ()) -> Iterator[tuple]:
    for k, v in d.items():
        yield (*prefix, k)
        if isinstance(v, dict):
            yield from _paths(v, (*prefix, k))


def mutations(seed: int, count: int, absurd: bool = True) -> Iterator[tuple[str, dict]]:
    """``count`` (label, config dict) pairs: a published config with one key dropped, renamed,
    retyped, or (with ``absurd``, one in three) a size key set to an absurd value."""
    rng = random.Random(seed)
    configs = sorted(DATA.glob("*.json"))
    for _ in range(count):
        path = rng.choice(configs)
        d = json.loads(path.read_text(encoding="utf-8"))
        sizes = [p for p in _paths(d) if p[-1] in SIZE_KEYS]
        if absurd and sizes and rng.random() < 1 / 3:
            where, kind = rng.choice(sizes), "absurd"
        else:
            keys = [p for p in _paths(d) if "rope" in "".join(map(str, p)) or len(p) <= 2]
            where = rng.choice(keys)
            kind = rng.choice(["drop", "rename", "retype", "retype"])
        parent = d
        for k in where[:-1]:
            parent = parent[k]
        if kind == "drop":
            del parent[where[-1]]
        elif kind == "rename":
            parent[where[-1] + rng.choice(["_", "s", "X"])] = parent.pop(where[-1])
        elif kind == "absurd":
            parent[where[-1]] = rng.choice(ABSURD)
        else:
            parent[where[-1]] = copy.deepcopy(rng.choice(WEIRD))
        yield f"{path.name}: {kind} {'.'.join(map(str, where))}", d


class TooSlow(BaseException):
    """A mutation still running after its time (a loop over an absurd count)."""


def _too_slow(signum: int, frame: object) -> None:
    raise TooSlow


def run_one(path: pathlib.Path, seconds: int = 10) -> tuple[int | str, str, float]:
    """``posemb inspect PATH`` in this process, stopped after ``seconds``: (exit status, or
    the exception that escaped it; its stderr; seconds taken)."""
    from posemb import cli

    err = io.StringIO()
    started = time.perf_counter()
    previous = signal.signal(signal.SIGALRM, _too_slow)
    signal.alarm(seconds)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            status: int | str = cli.main(["inspect", str(path)])
    except TooSlow:
        status = f"still running after {seconds} s"
    except BaseException as exc:  # the door left open (MemoryError included)
        status = f"{type(exc).__name__}: {str(exc)[:200]}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return status, err.getvalue(), time.perf_counter() - started


def fuzz(count: int, seed: int, folder: pathlib.Path) -> dict[str, object]:
    """Run ``count`` mutations; a summary with the failures (at most 10 listed)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text((DATA / "llama__llama-3.1-8b-instruct.json").read_text())
    run_one(path)  # imports (transformers' among them) once, outside the timings
    statuses: dict[str, int] = {}
    failures: list[str] = []
    slowest = (0.0, "")
    for label, d in mutations(seed, count):
        path.write_text(json.dumps(d))
        status, err, seconds = run_one(path)
        key = str(status) if isinstance(status, int) else "escaped"
        statuses[key] = statuses.get(key, 0) + 1
        lines = err.strip().splitlines()
        if status == 2 and not (len(lines) == 1 and lines[0].startswith("posemb inspect: error:")):
            failures.append(f"{label}: exit 2 with {len(lines)} lines: {err[:300]!r}")
        elif status not in (0, 2):
            failures.append(f"{label}: {status}")
        slowest = max(slowest, (seconds, label))
    return {
        "mutations": count,
        "seed": seed,
        "statuses": statuses,
        "slowest_s": round(slowest[0], 2),
        "slowest": slowest[1],
        "failures": len(failures),
        "first_failures": failures[:10],
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--mutations", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit-gb", type=float, default=4.0, help="address-space limit")
    parser.add_argument("--folder", default=None, help="where the mutated config is written")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    limit = int(args.limit_gb * (1 << 30))
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import tempfile

    with tempfile.TemporaryDirectory(prefix="posemb-fuzz-") as tmp:
        report = fuzz(args.mutations, args.seed, pathlib.Path(args.folder or tmp))
    report["limit_gb"] = args.limit_gb
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(
            f"{report['mutations']} mutations (seed {args.seed}, {args.limit_gb:g} GB address "
            f"space): {report['statuses']}; slowest {report['slowest_s']} s "
            f"({report['slowest']}); {report['failures']} failure(s)"
        )
        for line in report["first_failures"]:  # type: ignore[attr-defined]
            print("  " + line)
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
