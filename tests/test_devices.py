"""Every test runs where it is collected: a test that takes a ``backend`` builds its tensors on
that backend's device (``devices.device_of``), so the suite that runs the Triton kernels
through the interpreter on a CPU host runs them for real on a CUDA host. The first GPU run
found 107 tests that built CPU tensors and asked for ``backend="triton"``; this scan of the
test sources would have failed on each."""

from __future__ import annotations

import ast
import pathlib

import pytest

from devices import GPU_BACKENDS, device_of

TESTS = pathlib.Path(__file__).parent
FACTORIES = frozenset(
    [
        "randn",
        "rand",
        "randint",
        "randperm",
        "zeros",
        "ones",
        "empty",
        "full",
        "arange",
        "linspace",
        "eye",
        "tensor",
        "as_tensor",
    ]
)
WHY = "# cpu:"  # on the factory's line or the line above: why this tensor stays on the CPU


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _moved(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """``torch.x(...)`` followed, through arithmetic and a chain of method calls, by
    ``.to(...)`` or ``.cuda()``."""
    while isinstance(parents.get(node), (ast.BinOp, ast.UnaryOp)):
        node = parents[node]
    while isinstance(parents.get(node), ast.Attribute):
        attr = parents[node]
        if attr.attr in ("to", "cuda"):
            return True
        call = parents.get(attr)
        if not isinstance(call, ast.Call):
            return False
        node = call
    return False


def _checked(tree: ast.Module) -> list[ast.FunctionDef]:
    """Functions that take a ``backend`` and the module's functions they call, transitively."""
    functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    todo = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and _takes_backend(f)]
    seen: dict[int, ast.FunctionDef] = {}
    while todo:
        fn = todo.pop()
        if id(fn) in seen:
            continue
        seen[id(fn)] = fn
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                callee = functions.get(node.func.id)
                if callee is not None:
                    todo.append(callee)
    return list(seen.values())


def _takes_backend(fn: ast.FunctionDef) -> bool:
    return any(a.arg == "backend" for a in fn.args.args + fn.args.kwonlyargs)


def violations(source: str, name: str = "<test>") -> list[str]:
    """Each tensor factory in a backend's test (or a helper it calls) that names no device,
    is not moved, and says nothing of why: ``file:line function: code``."""
    tree = ast.parse(source)
    lines = source.splitlines()
    parents = _parents(tree)
    found = []
    for fn in _checked(tree):
        for node in ast.walk(fn):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "torch"
                and node.func.attr in FACTORIES
            ):
                continue
            if any(k.arg == "device" for k in node.keywords) or _moved(node, parents):
                continue
            here = lines[node.lineno - 1]
            above = lines[node.lineno - 2] if node.lineno > 1 else ""
            if WHY in here or above.strip().startswith(WHY):
                continue
            found.append(f"{name}:{node.lineno} {fn.name}: {here.strip()}")
    return found


def test_every_backends_test_builds_its_tensors_on_its_device():
    found = []
    for path in sorted(TESTS.glob("test_*.py")):
        found += violations(path.read_text(), path.name)
    assert not found, "name the device (devices.device_of(backend)):\n" + "\n".join(found)


def test_no_test_module_chooses_a_backends_device_itself():
    """One rule, in devices.py: a module that asks torch.cuda.is_available() itself can pick
    another device for a backend than the rule does."""
    own = []
    for path in sorted(TESTS.glob("test_*.py")):
        source = path.read_text()
        functions = [f for f in ast.walk(ast.parse(source)) if isinstance(f, ast.FunctionDef)]
        if "torch.cuda.is_available()" in source and any(map(_takes_backend, functions)):
            own.append(path.name)
    assert not own, own


@pytest.mark.parametrize(
    ("source", "bad"),
    [
        ("def test_a(backend):\n    q = torch.randn(2, 3)\n", 1),
        ("def test_a(backend):\n    q = torch.randn(2, 3, device=device_of(backend))\n", 0),
        ("def test_a(backend):\n    q = torch.randn(2, generator=g).to(dev, torch.half)\n", 0),
        ("def test_a(backend):\n    q = torch.arange(3).expand(2, 3).to(dev)\n", 0),
        ("def test_a(backend):\n    q = torch.arange(3) + 1\n", 1),
        ("def test_a(backend):\n    q = (1 + 2 * torch.randn(3)).to(dev)\n", 0),
        ("def test_a(backend):\n    # cpu: a host table\n    q = torch.arange(3)\n", 0),
        ("def make():\n    return torch.ones(2)\n\ndef test_a(backend):\n    make()\n", 1),
        ("def test_a(dtype):\n    q = torch.randn(2, 3)\n", 0),
    ],
)
def test_the_scan_finds_what_it_should(source, bad):
    assert len(violations(source)) == bad


def test_each_backend_gets_a_device_that_runs_it_here():
    import torch

    for backend in ("reference", "cpu", "auto", *GPU_BACKENDS):
        want = "cuda" if torch.cuda.is_available() and backend in GPU_BACKENDS else "cpu"
        assert device_of(backend) == want
