"""The tests mirror the source tree: each module of src/posemb with behaviour has a test module
named after it, or is listed here with the test module that covers it and why.

``src/posemb/<m>.py`` -> ``tests/test_<m>.py``; ``src/posemb/<pkg>/<m>.py`` ->
``tests/test_<pkg>_<m>.py`` or ``tests/<pkg>/test_<m>.py``; a package's ``__init__.py`` ->
``tests/test_<pkg>.py``; a private module's test drops the underscore (``test_errors.py``).
"""

import pathlib

import pytest

ROOT = pathlib.Path(__file__).parent.parent

COVERED_ELSEWHERE = {
    # No behaviour of their own.
    "__init__.py": "the public names: test_import.py",
    "__main__.py": "python -m posemb: test_cli.py",
    "_version.py": "one string",
    "lesson/__init__.py": "empty",
    "bench/__init__.py": "empty",
    "bench/timing.py": "the rounds every bench is timed in: test_bench_hf.py, test_bench_decode.py",
    "attention/kernels.py": "the calls' kernels, each against the explicit tiles: "
    "test_attention_core.py",
    "attention/module.py": "PositionalAttention: test_attention.py, test_logit_modifiers.py",
    "attention/reference.py": "the written-out attention: test_attention.py",
    "attention/extension.py": "training-free extension: test_extension.py (and the core's "
    "tests through it)",
    "bench/rows.py": "the benches' records and their CSV recogniser: test_bench_kernels.py, "
    "test_cli.py",
    "kernels/norm_reference.py": "the definition every norm_rotate backend is tested against: "
    "test_kernels_norm.py",
    "hf/extension_cache.py": "the tagged cache through crop, reorder and refusals: "
    "test_hf_extension.py, test_hf_extension_masks.py",
    "bench/outputs.py": "which CSV --out may replace: test_bench_kernels.py, test_cli.py",
    "lab/__init__.py": "re-exports: test_import.py",
    "hf/__init__.py": "re-exports: test_import.py",
    "hf/spec.py": "the RopeSpec records, read and checked through test_hf_config.py",
    "hf/upstream.py": (
        "transformers' reading of a config: test_hf_doctor.py, and every hf test that compares "
        "with transformers through hf_reference.py"
    ),
    # Covered by the test of the module that is their door.
    "_checks.py": "argument checks, through every door they guard: test_errors.py, test_fuzz.py",
    "_io.py": "atomic writes, through the commands that write them: test_hf_convert.py, ...",
    "_renamed.py": "old names with a warning: test_import.py",
    "hf/kind.py": "one layer kind read in steps: test_hf_config.py, test_hf_real_configs.py",
    "kernels/layout.py": "Layout and pairings: test_rope.py, test_kernels.py",
    "kernels/reference.py": "the oracle every backend is tested against: test_kernels.py",
    "kernels/ops.py": (
        "the CPU op's autograd and fake impls: test_kernels.py and test_kernels_cpu.py run "
        "opcheck and every backend against the reference in one parametrized suite"
    ),
    "kernels/triton.py": "the Triton backend, in the same suite: test_kernels.py",
    "kernels/dispatch.py": (
        "rotate and rotate_cached, the package's entry points: test_kernels.py, test_errors.py"
    ),
    "kernels/triton_path.py": (
        "the Triton path's host side: test_kernels.py (every Triton case), test_gpu.py (its "
        "decode fast path, on a GPU)"
    ),
    "kernels/triton_norm.py": "the Triton norm_rotate, with the others: test_kernels_norm.py",
    "kernels/build.py": "the op's compile flags: test_kernels_cpu.py, test_wheel.py",
    "lab/race.py": "the fine-tuning race runs in a sweep: test_lab_tasks.py",
    "lab/resumable.py": (
        "a job's training across invocations: test_lab_sweep.py (killed jobs resume to the "
        "same result), test_lab_distributed.py (ranks resume from one checkpoint)"
    ),
    "lesson/registry.py": "what screens register: lesson/test_claims.py",
    "lesson/measure.py": "read by every screen's test: lesson/test_s01_blender.py ...",
    "lesson/charts.py": "every chart's spec: lesson/test_figures.py",
    "lesson/diagrams.py": "every SVG state: lesson/test_figures.py, lesson/test_browser.py",
    "lesson/render.py": "the page's HTML and manifest: lesson/test_page.py",
    "lesson/screens/__init__.py": "the screens found by name: lesson/test_claims.py",
    "attention/masks.py": (
        "what a call of the blocked core reads: test_attention_core.py, "
        "test_attention_tiled.py, test_hf_extension_masks.py"
    ),
}


def _candidates(rel: pathlib.PurePosixPath) -> list[str]:
    parts = rel.with_suffix("").parts
    if parts[-1] == "__init__":
        return [f"test_{'_'.join(parts[:-1])}.py"]
    if len(parts) == 1:  # a private module's test drops its underscore: _errors -> test_errors
        return [f"test_{parts[0].lstrip('_')}.py"]
    return [f"test_{'_'.join(parts)}.py", f"{'/'.join(parts[:-1])}/test_{parts[-1]}.py"] + (
        [f"{parts[0]}/test_{parts[-1]}.py"] if len(parts) > 2 else []
    )


def test_every_module_has_its_test_module_or_a_reason():
    src = ROOT / "src" / "posemb"
    missing, stale = [], []
    for path in sorted(src.rglob("*.py")):
        rel = pathlib.PurePosixPath(path.relative_to(src).as_posix())
        found = [c for c in _candidates(rel) if (ROOT / "tests" / c).exists()]
        if str(rel) in COVERED_ELSEWHERE:
            if found:
                stale.append(f"{rel} has {found[0]}: drop it from COVERED_ELSEWHERE")
        elif not found:
            missing.append(f"{rel}: no {' or '.join(_candidates(rel))}")
    gone = [m for m in COVERED_ELSEWHERE if not (src / m).exists()]
    assert not missing and not stale and not gone, (missing, stale, gone)


def test_every_test_module_names_a_module_or_a_concern():
    """A test module that mirrors nothing says what it tests across modules."""
    concerns = {
        "test_cli.py",  # the posemb command (cli.py)
        "test_compile.py",  # torch.compile and torch.export across modules
        "test_fuzz.py",  # every door
        "test_import.py",  # the public API and its renamed names
        "test_docs.py",  # the README and the documentation site
        "test_tree.py",
        "test_wheel.py",  # the wheel, installed where no compiler is
        "test_front_door.py",  # the README's install lines and make demo, as a newcomer runs them
        "test_hf_configs_data.py",  # tests/data/hf_configs
        "test_hf_real_configs.py",  # published configs against transformers
        "test_hf_patch_models.py",  # patch_rotary on real model families
        "test_axial_presets.py",  # axial.py's presets against transformers and torchtune
        "test_lab_distributed.py",  # lab/distributed.py
        "test_lab_tasks.py",
        "test_kerple.py",  # bias.py's KERPLE, against its two kernels
        "test_logit_modifiers.py",  # sinks, SSMax and windows: attention.py, temperature.py
        "lesson/test_browser.py",  # the built page in Chromium
        "lesson/test_a11y.py",  # the built page for every reader: what axe cannot see
        "test_devices.py",  # every backend's test builds its tensors on its device
        "test_gpu.py",  # on a CUDA GPU: CUDA-graph capture, no host sync
        "test_gpu_check.py",  # benchmarks/gpu.sh, the GPU check, and its summary
        "test_fire_op.py",  # FIRE's fused CPU op (kernels/csrc/fire.cpp, attention/scores.py)
    }
    src = ROOT / "src" / "posemb"
    mirrored = set()
    for path in src.rglob("*.py"):
        mirrored |= set(_candidates(pathlib.PurePosixPath(path.relative_to(src).as_posix())))
    tests = [p.relative_to(ROOT / "tests").as_posix() for p in (ROOT / "tests").rglob("test_*.py")]
    strays = sorted(t for t in tests if t not in mirrored and t not in concerns)
    assert not strays, strays


def test_no_module_imports_itself_through_others():
    """Issue 54: two circles of imports (bench/hf.py <-> bench/outputs.py, hidden behind
    importlib; kernels/norm.py <-> kernels/triton_norm.py, behind function-level imports) let
    a module's behaviour depend on which was imported first. grimp sees imports inside
    functions too; a module named to importlib as a string is refused outright."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("posemb")
    circles = set()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            chain = graph.find_shortest_chain(importer=imported, imported=module)
            if chain:
                circles.add(" -> ".join((module, *chain)))
    assert not circles, sorted(circles)
    by_name = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in (ROOT / "src" / "posemb").rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "import_module(" in line and '"posemb.' in line
    ]
    assert not by_name, by_name
