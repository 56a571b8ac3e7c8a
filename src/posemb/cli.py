"""The ``posemb`` command: one subcommand per job.

Errors in what the user typed exit with status 2 and one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

from ._errors import InputError
from ._version import __version__


def _verdict_note(row: dict[str, object]) -> str:
    verdict = row["verdict"]
    if verdict in ("holds", "n/a"):
        return ""
    return f"lesson {verdict}: it says \u201c{row['lesson_says']}\u201d"


def format_table(rows: list[dict[str, object]], width: int = 100) -> str:
    """Render claim rows as plain text, grouped by lesson screen: result, id, claim, measured."""
    passed = sum(bool(r["passed"]) for r in rows)
    # A correction counts only where its check passed: a failed one establishes nothing.
    corrected = sum(bool(r["passed"]) and r["verdict"] not in ("holds", "n/a") for r in rows)
    unconfirmed = sum(not r["passed"] and r["verdict"] not in ("holds", "n/a") for r in rows)
    lines = [
        f"posemb verify: {passed}/{len(rows)} claims hold as measured; "
        f"the lesson is wrong or imprecise on {corrected} of them"
        + (f" ({unconfirmed} more correction(s) failed their check)." if unconfirmed else "."),
    ]
    indent = " " * 7
    screen = None
    for r in rows:
        if r["screen"] != screen:
            screen = r["screen"]
            lines += ["", f"Screen {screen}: {r['screen_title']}"]
        mark = "PASS" if r["passed"] else "FAIL"
        lines.append(f"{mark}   {r['id']}")
        for key, text in (("", r["claim"]), ("measured: ", r["measured"])):
            lines += textwrap.wrap(
                f"{key}{text}", width, initial_indent=indent, subsequent_indent=indent + "  "
            )
        note = _verdict_note(r)
        if note:
            lines += textwrap.wrap(
                note, width, initial_indent=indent, subsequent_indent=indent + "  "
            )
    return "\n".join(lines)


def _is_claims_file(data: bytes) -> bool:
    """Whether a file is an earlier ``posemb verify --save`` output (it may be replaced)."""
    try:
        rows = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    return (
        isinstance(rows, list)
        and bool(rows)
        and all(isinstance(r, dict) and "posemb" in r and "id" in r for r in rows)
    )


def _cmd_verify(args: argparse.Namespace) -> int:
    from .lesson.claims import CLAIMS, run_all

    if args.list:
        for c in CLAIMS:
            print(f"{c.screen}  {c.id}")
        return 0
    if args.save:
        from ._owned import check_output_file

        # Checked first: the claims take a minute, and a path that cannot be written would
        # lose every measurement.
        check_output_file(args.save, "--save", _is_claims_file, force=args.force)
    rows = run_all(args.only)
    if args.save:
        from ._io import atomic_write

        text = json.dumps(rows, indent=2)
        atomic_write(args.save, lambda tmp: pathlib.Path(tmp).write_text(text, encoding="utf-8"))
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(format_table(rows))
    return 0 if all(r["passed"] for r in rows) else 1


def _cmd_lesson(args: argparse.Namespace) -> int:
    from .lesson import page

    rows = page.load_claims(args.claims) if args.claims else None
    built = page.build_lesson(args.out, rows, force=args.force)
    print(
        f"wrote {built.index} ({built.bytes / 1e6:.1f} MB, {built.seconds:.1f} s); open it in a "
        f"browser: {built.index.resolve().as_uri()}"
    )
    if built.failed:
        print(f"{len(built.failed)} claim(s) failed: {', '.join(built.failed)}", file=sys.stderr)
    if args.open:
        import webbrowser

        webbrowser.open(built.index.resolve().as_uri())
    return 1 if built.failed else 0


def _refuse_unused(why: str, given: dict[str, bool]) -> None:
    """Refuse options given where they do not apply (they were silently ignored)."""
    extra = [flag for flag, on in given.items() if on]
    if extra:
        raise InputError(f"{', '.join(extra)} does not apply here: {why}")


def _cmd_inspect(args: argparse.Namespace) -> int:
    from . import hf

    config = hf.load_config(args.config)
    strict = not args.lenient
    if args.vision:
        _refuse_unused(
            "--vision reads the vision tower's preset",
            {"--seq-len": args.seq_len is not None, "--layer-type": args.layer_type is not None,
             "--lenient": args.lenient, "--no-transformers": args.no_transformers},
        )  # fmt: skip
        vision = hf.vision_report(config)
        print(json.dumps(vision, indent=2) if args.json else hf.format_vision(vision))
        return 0
    if args.layer_type is None:
        model = hf.inspect_model(config, args.seq_len, strict=strict)
        text = "" if args.json else hf.format_model(model)
    else:
        model = hf.inspect_report(config, args.seq_len, args.layer_type, strict=strict)
        text = "" if args.json else hf.format_inspect(model)
    # posemb's reading first: a config it refuses (absurd sizes) never reaches transformers.
    if args.no_transformers:
        check = None
    else:
        check = hf.transformers_differs(config, layer_type=args.layer_type, strict=strict)
    if args.json:
        extra = {} if check is None else {"transformers_check": check["summary"],
                                          "transformers_differs": check["differs"]}  # fmt: skip
        print(json.dumps({**model, **extra}, indent=2))
    else:
        print(text if check is None else text + "\n" + hf.format_differs(check))
    return 0


def _cmd_convert(args: argparse.Namespace) -> int:
    from . import hf

    heads, kv, rotary = args.num_heads, args.num_kv_heads, args.rotary_dim
    if args.config is not None:
        shape = hf.attention_shape(hf.load_config(args.config))
        heads = heads or shape.num_heads
        kv = kv or shape.num_kv_heads
        rotary = rotary or shape.rotary_dim
    if heads is None:
        raise InputError("--num-heads is required unless --config gives num_attention_heads")
    how = dict(
        to=args.to,
        num_heads=heads,
        num_kv_heads=kv,
        rotary_dim=rotary,
        q_pattern=args.q_pattern,
        k_pattern=args.k_pattern,
        overwrite=args.force,
    )
    counts = f"to the {args.to} layout ({heads} q heads, {kv or heads} kv heads)"
    src = pathlib.Path(args.input)
    if src.is_dir() or src.name.endswith(hf.convert.INDEX_SUFFIX):
        shards = hf.convert_sharded(src, args.output, **how)
        n = sum(len(names) for names in shards.values())
        copied = sum(not names for names in shards.values())
        print(
            f"converted {n} q/k tensors {counts} in {len(shards) - copied} of {len(shards)} "
            f"shards ({copied} without q/k copied unchanged); wrote {args.output} (the shards "
            f"and the index; copy the config and tokenizer files yourself)"
        )
        return 0
    converted = hf.convert_checkpoint(args.input, args.output, **how)
    if not converted:
        print(f"no q/k tensors in this shard: copied unchanged to {args.output}")
        return 0
    print(f"converted {len(converted)} q/k tensors {counts}; wrote {args.output}")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench import hf as hf_bench
    from .bench import kernels as bench
    from .bench.outputs import is_bench_csv

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if args.out:
        from ._owned import check_output_file

        check_output_file(args.out, "--out", is_bench_csv, force=args.force)
    one_off: dict[str, float] = {}
    chosen = [flag for flag in ("hf", "decode", "norm") if getattr(args, flag)]
    if len(chosen) > 1:
        raise InputError(f"--{' and --'.join(chosen)} are different benches: pass one")
    if chosen and args.shapes:
        raise InputError(f"--shapes names kernel shapes; --{chosen[0]} times a fixed setup")
    if args.norm:
        from .bench import norm as norm_bench

        _refuse_unused("the norm bench times fp32 and bf16 both", {"--dtype": bool(args.dtype)})
        rows: list = norm_bench.run(
            device=args.device,
            quick=args.quick,
            repeats=args.repeats,
            progress=None if args.json else progress,
        )
    elif args.decode:
        from .bench import decode as decode_bench

        rows = decode_bench.run(
            device=args.device,
            quick=args.quick,
            repeats=args.repeats,
            dtype=args.dtype or "fp32",
            progress=None if args.json else progress,
        )
    elif args.hf:
        rows = hf_bench.run(
            device=args.device,
            quick=args.quick,
            repeats=args.repeats,
            dtype=args.dtype or "fp32",
            progress=None if args.json else progress,
        )
    else:
        # The kernel bench times fp32 and bf16 both: a --dtype would be silently ignored.
        _refuse_unused("the kernel bench times fp32 and bf16 both", {"--dtype": bool(args.dtype)})
        rows, one_off = bench.run(
            device=args.device,
            quick=args.quick,
            repeats=args.repeats,
            shapes=args.shapes,
            progress=None if args.json else progress,
        )
    if args.out:
        bench.write_csv(rows, args.out)
    if args.json:
        from dataclasses import asdict

        print(json.dumps({"one_off": one_off, "rows": [asdict(r) for r in rows]}, indent=2))
    else:
        if args.norm:
            print(norm_bench.summary(rows))
        elif args.decode:
            print(decode_bench.summary(rows))
        else:
            print(hf_bench.summary(rows) if args.hf else bench.summary(rows, one_off))
        if args.out:
            print(f"wrote {len(rows)} rows to {args.out}")
    return 0


def _cmd_kernels(args: argparse.Namespace) -> int:
    import dataclasses

    from . import kernels
    from .kernels import cpu

    if args.if_possible and not args.build:
        raise InputError("--if-possible goes with --build")
    # --build says why itself: the op's own warning would be the same line twice.
    if args.build and cpu.load(verbose=args.verbose, announce=False) is None:
        reason = cpu.unavailable_reason()
        if args.if_possible:
            print(f"posemb kernels: no fused CPU op here ({reason}); posemb runs the reference "
                  f"rotation, exact and slower", file=sys.stderr)  # fmt: skip
            return 0
        print(f"posemb kernels: the CPU op is unavailable: {reason}", file=sys.stderr)
        return 1
    report: dict[str, object] = dict(kernels.status())
    loaded = cpu.info()
    op = dataclasses.asdict(loaded) if loaded else None
    if args.json:
        print(json.dumps({**report, "cpu_op": op}, indent=2))
        return 0
    for name, state in report.items():
        print(f"{name:10} {state}")
    if loaded is not None:
        runs = ", ".join(
            f"{n}{'' if ok else ' (not on this CPU)'}" for n, ok in loaded.variants.items()
        )
        print(f"cpu op     {loaded.source}: {loaded.path}")
        print(f"           variant {loaded.variant}: {loaded.variant_reason}; compiled: {runs}")
        print(f"           built with torch {loaded.torch_headers} headers, loads into torch "
              f">= {loaded.torch_target}; loaded in {loaded.load_seconds:.2f} s")  # fmt: skip
        for why in loaded.skipped:
            print(f"           skipped: {why}")
    return 0


def _cmd_lab(args: argparse.Namespace) -> int:
    import dataclasses

    from . import _extras

    # At the door: a run can take hours, and its plots come at the end.
    _extras.require("matplotlib", "posemb lab (its plots)", "lab")
    from .lab import corpus, report, sweep
    from .lab.config import SUITES
    from .lab.stopping import Stopped

    preset = args.preset
    if args.quick:
        if preset not in (None, "quick"):
            raise InputError(f"--quick is --preset quick; it cannot be used with --preset {preset}")
        preset = "quick"
    if preset == "gpu" and args.device in (None, "auto"):
        import torch

        if not torch.cuda.is_available():
            raise InputError(
                "--preset gpu trains on --device cuda, and no CUDA GPU is visible here; add "
                "--device cpu to run it on the CPU anyway (hours to days), or use --preset quick"
            )
    corpus.refuse_shadowed(args.corpus)  # typed, and a file of that name is here
    presets = {"quick": sweep.quick_config, "gpu": sweep.gpu_config}
    base = presets[preset]() if preset else sweep.LabConfig()
    if args.suite:
        if preset:
            raise InputError(f"--suite chooses variants and tasks; --preset {preset} has its own")
        suite_variants, suite_tasks = SUITES[args.suite]
        base = dataclasses.replace(base, variants=suite_variants, tasks=suite_tasks)
    eval_lens = tuple(args.eval_lens) if args.eval_lens else None
    if args.train_len is not None and eval_lens is None:
        eval_lens = tuple(args.train_len * m for m in (1, 2, 4, 8, 16))
    if args.train_len is not None and args.race_len is None:
        args.race_len = 4 * args.train_len  # the race extends the context 4x by default
    overrides = {
        k: v
        for k, v in {
            "variants": tuple(args.variants) if args.variants else None,
            "train_len": args.train_len,
            "eval_lens": eval_lens,
            "steps": args.steps,
            "seeds": tuple(args.seeds) if args.seeds else None,
            "corpus": args.corpus,
            "workers": args.workers,
            "finetune_len": args.finetune_len,
            "finetune_steps": args.finetune_steps,
            "tasks": tuple(args.tasks) if args.tasks else None,
            "retrieval_steps": args.retrieval_steps,
            "multikey_steps": args.multikey_steps,
            "multikey_needles": args.multikey_needles,
            "vartrack_steps": args.vartrack_steps,
            "vartrack_hops": args.vartrack_hops,
            "vartrack_chains": args.vartrack_chains,
            "flipflop_steps": args.flipflop_steps,
            "race_len": args.race_len,
            "race_steps": tuple(args.race_steps) if args.race_steps else None,
            "race_seeds": tuple(args.race_seeds) if args.race_seeds else None,
            "batch": args.batch,
            "device": args.device,
            "data_parallel": args.data_parallel or None,
        }.items()
        if v is not None
    }
    cfg = dataclasses.replace(base, **overrides)
    named = {"quick": "lab-quick", "gpu": "lab-gpu", "recent": "lab-recent", "all": "lab-all"}
    out = args.out or named.get(preset or args.suite or "", "lab-results")
    try:
        summary = sweep.run(cfg, out, quiet=args.json, force=args.force)
    except Stopped as stop:  # one line, a signal's exit status; the finished jobs are kept
        print(
            f"posemb lab: {stop}; the finished jobs are kept in {out}: run the same command "
            f"to resume",
            file=sys.stderr,
        )
        return 128 + stop.signum
    if summary is None:  # a torchrun rank other than 0: rank 0 reports
        return 0
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(report.markdown(summary))
        print(
            f"wrote {out}/results.json, {out}/results.md"
            + "".join(f", {p}" for p in summary.get("plots", []))
        )
    return 0


def _path(text: str) -> str:
    """An output path: never empty (an unset $VAR gave "" and ran with no output at all)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must be a path, got an empty string")
    return text


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return v


def _add_verify(sub: Any) -> None:
    """The ``posemb verify`` subcommand."""
    verify = sub.add_parser(
        "verify",
        help="check the lesson's mathematical claims and print what was measured",
        description="Run every claim of the positional-embedding lesson as a check. "
        "Exit status 1 if any check fails.",
    )
    verify.add_argument(
        "--json",
        action="store_true",
        help="print a JSON list of {id, claim, passed, measured, ...} instead of a table",
    )
    verify.add_argument(
        "--only", nargs="+", metavar="ID", help="run only these claims (ids from --list)"
    )
    verify.add_argument("--list", action="store_true", help="list the claim ids by screen")
    verify.add_argument(
        "--save",
        type=_path,
        metavar="FILE",
        help="also write the JSON rows to FILE (atomically), for posemb lesson --claims; "
        "an existing FILE that is not an earlier --save is refused",
    )
    verify.add_argument("--force", action="store_true", help="replace FILE whatever it holds")
    verify.set_defaults(func=_cmd_verify)


def _add_lesson(sub: Any) -> None:
    """The ``posemb lesson`` subcommand."""
    lesson = sub.add_parser(
        "lesson",
        help="build the lesson as an offline, interactive page with every claim checked",
        description="Write a self-contained folder (index.html, parchment.png/.svg, "
        "claims.json, manifest.json) that opens from file:// with no network. Exit status 1 "
        "if a claim fails (the page is still written, marking it), 2 on bad input.",
    )
    lesson.add_argument(
        "--out",
        type=_path,
        default="posemb-lesson",
        help="folder to write (default ./posemb-lesson)",
    )
    lesson.add_argument(
        "--claims",
        metavar="FILE",
        help="reuse a posemb verify --save file instead of running the claims again",
    )
    lesson.add_argument("--open", action="store_true", help="open the page in a browser")
    lesson.add_argument(
        "--force",
        action="store_true",
        help="write into a folder holding files this command did not write (kept, never "
        "replaced) or its own files edited since (replaced)",
    )
    lesson.set_defaults(func=_cmd_lesson)


def _add_inspect(sub: Any) -> None:
    """The ``posemb inspect`` subcommand."""

    inspect = sub.add_parser(
        "inspect",
        help="show the RoPE frequencies a Hugging Face config.json describes",
        description="Print rope type, dimensions, base, attention factor and a per-frequency "
        "table (inv_freq, wavelength in tokens, the scale the method applied, its band).",
    )
    inspect.add_argument("config", help="path to a config.json (transformers 4.x or 5.x form)")
    inspect.add_argument(
        "--seq-len", type=_positive, help="sequence length, for dynamic and longrope"
    )
    inspect.add_argument(
        "--layer-type",
        help="one layer type of a config with layer kinds (default: print every layer type)",
    )
    inspect.add_argument(
        "--lenient",
        action="store_true",
        help="warn about rope keys the rope type does not read instead of refusing them",
    )
    inspect.add_argument(
        "--vision",
        action="store_true",
        help="the vision tower's RoPE instead: its axial preset, head_dim and base",
    )
    inspect.add_argument(
        "--no-transformers",
        action="store_true",
        help="skip the comparison with the installed transformers' reading of the config "
        "(by default a section, or transformers_differs in --json, names each layer kind "
        "transformers reads differently from the file, or says that it cannot read it)",
    )
    inspect.add_argument("--json", action="store_true", help="print a JSON object instead")
    inspect.set_defaults(func=_cmd_inspect)


def _add_convert(sub: Any) -> None:
    """The ``posemb convert`` subcommand."""
    from .hf import K_PATTERN, Q_PATTERN

    convert = sub.add_parser(
        "convert",
        help="permute q/k weights of a safetensors checkpoint between RoPE layouts",
        description="Reorder q/k projection rows so a checkpoint trained with one RoPE layout "
        "computes the same attention under the other (interleaved is Meta's, half is Hugging "
        "Face's). Reads and writes safetensors only; other tensors are copied unchanged.",
    )
    convert.add_argument(
        "input",
        help="input .safetensors file, or a sharded checkpoint's index or folder (never modified)",
    )
    convert.add_argument(
        "output", help="output .safetensors file, or folder for a sharded checkpoint"
    )
    convert.add_argument("--to", required=True, choices=("half", "interleaved"))
    convert.add_argument("--config", help="config.json or params.json giving the head counts")
    convert.add_argument("--num-heads", type=_positive, help="query heads")
    convert.add_argument("--num-kv-heads", type=_positive, help="key heads (default: query heads)")
    convert.add_argument("--rotary-dim", type=_positive, help="rotated channels per head")
    convert.add_argument("--q-pattern", default=Q_PATTERN, help="regex naming q tensors")
    convert.add_argument("--k-pattern", default=K_PATTERN, help="regex naming k tensors")
    convert.add_argument("--force", action="store_true", help="replace an existing output")
    convert.set_defaults(func=_cmd_convert)


def _add_bench(sub: Any) -> None:
    """The ``posemb bench`` subcommand."""
    bench = sub.add_parser(
        "bench",
        help="time posemb's RoPE paths against bandwidth references and other libraries",
        description="Prefill (4, 32, 2048, 128), decode (64, 32, 1, 128) and long "
        "(1, 8, 32768, 128) shapes, fp32 and bf16, forward, backward and both: median time, GB/s "
        "over the minimum traffic, and ratios against x.mul_(1.0), empty_like(x).copy_(x) and "
        "transformers' eager apply_rotary_pos_emb measured in the same run.",
    )
    bench.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    bench.add_argument("--quick", action="store_true", help="tiny shapes: proves it runs")
    bench.add_argument("--repeats", type=_positive, help="timed repetitions per measurement")
    bench.add_argument(
        "--shapes", nargs="+", choices=("prefill", "decode", "long"), help="a subset of shapes"
    )
    bench.add_argument(
        "--hf",
        action="store_true",
        help="instead: a transformers Llama decoder layer and a 4-layer model, eager against "
        "patch_rotary and patch_rotary(fused=True) (and Liger on CUDA), forward and "
        "forward+backward, with the rotation's share of each step",
    )
    bench.add_argument(
        "--decode",
        action="store_true",
        help="instead: one token per step at Llama 3.1 8B's attention shapes, batch 1 and 8: "
        "one layer's rotation, a 32-layer step and a small model's decode step, each against "
        "transformers in the same run (paired ratios)",
    )
    bench.add_argument(
        "--norm",
        action="store_true",
        help="instead: kernels.norm_rotate (QK-norm + RoPE in one pass) at prefill shapes, fp32 "
        "and bf16, forward and forward+backward, against rms_norm then kernels.rotate, the "
        "rotation alone and torch.compile of the two steps, in the same run",
    )
    bench.add_argument(
        "--dtype",
        choices=("fp32", "bf16"),
        help="--hf and --decode only: the model's and tensors' dtype (default fp32)",
    )
    bench.add_argument(
        "--out",
        type=_path,
        help="write a long-format CSV here (atomically); an existing file that is not an "
        "earlier --out is refused",
    )
    bench.add_argument("--force", action="store_true", help="replace --out whatever it holds")
    bench.add_argument("--json", action="store_true", help="print JSON instead of the table")
    bench.set_defaults(func=_cmd_bench)


def _add_kernels(sub: Any) -> None:
    """The ``posemb kernels`` subcommand."""
    kern = sub.add_parser(
        "kernels",
        help="say which RoPE backends can run here, and where the CPU op came from",
        description="Print each backend (reference, cpu, triton) and whether it can run here, "
        "or why not; for the CPU op, where it was loaded from (the wheel or a JIT build), the "
        "instruction-set variant that runs and why. --build loads it now, compiling it in a "
        "source checkout (a few seconds, once per machine), and exits 1 if it is unavailable.",
    )
    kern.add_argument("--build", action="store_true", help="load (or build) the CPU op now")
    kern.add_argument(
        "--if-possible",
        action="store_true",
        help="with --build: where the op cannot be built (no compiler, no ninja), say why once "
        "and exit 0; posemb then runs the reference rotation (what make demo and make test do)",
    )
    kern.add_argument("--verbose", action="store_true", help="show the compiler's output")
    kern.add_argument("--json", action="store_true", help="print a JSON object instead")
    kern.set_defaults(func=_cmd_kernels)


def _add_lab(sub: Any) -> None:
    """The ``posemb lab`` subcommand."""
    from .lab.model import VARIANTS

    lab = sub.add_parser(
        "lab",
        help="train each encoding at one length and measure it at longer ones",
        description="Train a small character LM per encoding at --train-len, evaluate on fixed "
        "held-out windows at each --eval-lens, and write results.json, results.md and plots. "
        "Resumable: rerun the same command to continue. Variants: " + ", ".join(VARIANTS),
    )
    lab.add_argument("--variants", nargs="+", metavar="VARIANT", help="encodings and scalings")
    lab.add_argument("--train-len", type=int, help="training length (default 64)")
    lab.add_argument("--eval-lens", type=int, nargs="+", help="evaluation lengths")
    lab.add_argument("--steps", type=int, help="training steps per model (default 500)")
    lab.add_argument("--seeds", type=int, nargs="+", help="seeds (default 0)")
    lab.add_argument("--corpus", help="a UTF-8 text file (default: the embedded KJV Bible)")
    lab.add_argument("--workers", type=int, help="worker processes (default 2)")
    lab.add_argument(
        "--finetune-len", type=int, help="fine-tune RoPE with position interpolation at this length"
    )
    lab.add_argument("--finetune-steps", type=int, help="steps of that fine-tune (adds rope+pi+ft)")
    lab.add_argument(
        "--tasks",
        nargs="+",
        metavar="TASK",
        help="lm (loss), retrieval, entropy, race, multikey, vartrack, flipflop (default: the "
        "suite's)",
    )
    lab.add_argument(
        "--suite",
        choices=("classic", "recent", "all"),
        help="classic (default): the encodings of 2017-2023, scalings and extensions on loss, "
        "retrieval, entropy and the race; recent: those of 2024-26 beside rope and nope on "
        "loss, retrieval, multikey, vartrack, flipflop and entropy; all: both",
    )
    lab.add_argument("--retrieval-steps", type=int, help="training steps per retrieval model")
    lab.add_argument("--multikey-steps", type=int, help="training steps per multikey model")
    lab.add_argument(
        "--multikey-needles", type=int, help="needles in a multikey window (4 positions each)"
    )
    lab.add_argument("--vartrack-steps", type=int, help="training steps per vartrack model")
    lab.add_argument(
        "--vartrack-hops", type=int, help="variable-to-variable hops in a vartrack chain"
    )
    lab.add_argument(
        "--vartrack-chains",
        type=int,
        help="chains in a vartrack window, one queried (each 4 * hops + 3 positions)",
    )
    lab.add_argument("--flipflop-steps", type=int, help="training steps per flipflop model")
    lab.add_argument("--race-len", type=int, help="length the race fine-tunes at (default 4x)")
    lab.add_argument("--race-steps", type=int, nargs="+", help="race milestones N (steps)")
    lab.add_argument("--race-seeds", type=int, nargs="+", help="fine-tuning seeds of the race")
    lab.add_argument(
        "--batch",
        type=int,
        help="LM windows per step (default 16), over all ranks with --data-parallel",
    )
    lab.add_argument(
        "--device",
        choices=("cpu", "cuda", "auto"),
        help="where the language models train: cpu (default; cuda with --preset gpu), cuda "
        "(cuda:LOCAL_RANK), auto (cuda if any); retrieval models and the race stay on the CPU",
    )
    lab.add_argument(
        "--data-parallel",
        action="store_true",
        help="under torchrun, train each language model over all ranks (DDP) instead of "
        "dealing jobs",
    )
    lab.add_argument(
        "--out", type=_path, help="output folder (default lab-results, lab-quick or lab-gpu)"
    )
    lab.add_argument(
        "--force",
        action="store_true",
        help="write into a folder holding files the lab did not write (kept, never replaced) "
        "or its own files edited since (replaced)",
    )
    lab.add_argument(
        "--preset",
        choices=("quick", "gpu"),
        help="quick: a small protocol (< 1 minute); gpu: train at 512, evaluate to 8192, an "
        "8-layer width-512 model on CUDA, loss and entropy (~15-20 min on one H200, an estimate)",
    )
    lab.add_argument("--quick", action="store_true", help="the same as --preset quick")
    lab.add_argument("--json", action="store_true", help="print results as JSON, no progress")
    lab.set_defaults(func=_cmd_lab)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``posemb`` command."""
    parser = argparse.ArgumentParser(
        prog="posemb",
        description="Positional encodings for transformers: checked claims, tables, tools.",
    )
    parser.add_argument("--version", action="version", version=f"posemb {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    _add_verify(sub)
    _add_lesson(sub)
    _add_inspect(sub)
    _add_convert(sub)
    _add_bench(sub)
    _add_kernels(sub)
    _add_lab(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``posemb`` command; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    from ._extras import MissingExtra

    try:
        return int(args.func(args))
    except (InputError, MissingExtra) as err:
        # Input posemb refuses (or a missing extra) is the user's to fix: one line, exit
        # status 2. Anything else is a bug, in posemb or below it: its traceback is shown and
        # the exit status is 1.
        print(f"posemb {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
