"""Every test runs where it is collected: a test that takes a ``backend`` (or a ``device``)
builds its tensors on that backend's device (``devices.device_of``), so the suite that runs
the Triton kernels through the interpreter on a CPU host runs them for real on a CUDA host.
The first GPU run found 107 tests that built CPU tensors and asked for ``backend="triton"``;
this scan of the test sources would have failed on each. Fixtures and helpers imported from
other modules are not followed: a backend's tensors are made in its test module."""

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


def _names_a_device(call: ast.Call) -> bool:
    """Whether ``x.to(...)`` moves: a ``device=`` keyword, two positionals (device, dtype), or
    one that is not a dtype (``torch.float16``, a name ending in ``dtype``)."""
    if any(k.arg == "device" for k in call.keywords):
        return True
    if len(call.args) >= 2:
        return True
    if len(call.args) == 1:
        arg = call.args[0]
        if isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name):
            return arg.value.id not in ("torch",)
        if isinstance(arg, ast.Name):
            return not arg.id.lower().endswith("dtype")
        return True
    return False


def _moved(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """``torch.x(...)`` followed, through arithmetic and a chain of method calls, by
    ``.to(<a device>, ...)`` or ``.cuda()`` (``.to(dtype)`` alone moves nothing)."""
    while isinstance(parents.get(node), (ast.BinOp, ast.UnaryOp)):
        node = parents[node]
    while isinstance(parents.get(node), ast.Attribute):
        attr = parents[node]
        call = parents.get(attr)
        if not isinstance(call, ast.Call):
            return False
        if attr.attr == "cuda" or (attr.attr == "to" and _names_a_device(call)):
            return True
        node = call
    return False


def _callee(node: ast.Call) -> str | None:
    """The name a call reaches a helper by: ``make(...)`` or ``self.make(...)``."""
    if isinstance(node.func, ast.Name):
        return node.func.id
    if (
        isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in ("self", "cls")
    ):
        return node.func.attr
    return None


def _checked(tree: ast.Module) -> list[ast.FunctionDef]:
    """Functions that take a ``backend`` or a ``device``, and the module's functions and
    methods they call, transitively."""
    functions: dict[str, ast.FunctionDef] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            functions[node.name] = node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    functions.setdefault(item.name, item)
    todo = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and _takes_backend(f)]
    seen: dict[int, ast.FunctionDef] = {}
    while todo:
        fn = todo.pop()
        if id(fn) in seen:
            continue
        seen[id(fn)] = fn
        for node in ast.walk(fn):
            if isinstance(node, ast.Call):
                callee = functions.get(_callee(node) or "")
                if callee is not None:
                    todo.append(callee)
    return list(seen.values())


def _takes_backend(fn: ast.FunctionDef) -> bool:
    return any(a.arg in ("backend", "device") for a in fn.args.args + fn.args.kwonlyargs)


def _torch_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """The names the module gives torch (``torch``, ``import torch as T``) and the factories
    it imports by name (``from torch import randn``)."""
    modules, factories = {"torch"}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname for a in node.names if a.name == "torch" and a.asname}
        elif isinstance(node, ast.ImportFrom) and node.module == "torch":
            factories |= {a.asname or a.name for a in node.names if a.name in FACTORIES}
    return modules, factories


def _factory(node: ast.AST, modules: set[str], factories: set[str]) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Name):
        return f.id in factories
    return (
        isinstance(f, ast.Attribute)
        and isinstance(f.value, ast.Name)
        and f.value.id in modules
        and f.attr in FACTORIES
    )


def _on_a_device(node: ast.Call) -> bool:
    """A ``device=`` keyword that is not the literal ``"cpu"`` (which needs a ``# cpu:``
    reason like any other tensor kept on the host)."""
    for k in node.keywords:
        if k.arg == "device":
            return not (isinstance(k.value, ast.Constant) and k.value.value == "cpu")
    return False


def violations(source: str, name: str = "<test>") -> list[str]:
    """Each tensor factory in a backend's (or device's) test, or a helper it calls, that names
    no device (or the CPU), is not moved, and says nothing of why:
    ``file:line function: code``. Fixtures and helpers imported from other modules are not
    followed."""
    tree = ast.parse(source)
    lines = source.splitlines()
    parents = _parents(tree)
    modules, factories = _torch_names(tree)
    found = []
    for fn in _checked(tree):
        for node in ast.walk(fn):
            if not _factory(node, modules, factories):
                continue
            assert isinstance(node, ast.Call)
            if _on_a_device(node) or _moved(node, parents):
                continue
            here = lines[node.lineno - 1]
            above = lines[node.lineno - 2] if node.lineno > 1 else ""
            if here.rstrip().endswith(WHY) or WHY + " " in here or above.strip().startswith(WHY):
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
        takes = [f for f in functions if any(a.arg == "backend" for a in f.args.args)]
        if "torch.cuda.is_available()" in source and takes:
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
        # .to(dtype) moves nothing; .to(device, dtype) and .to(device=...) do.
        ("def test_a(backend):\n    q = torch.randn(3).to(torch.float16)\n", 1),
        ("def test_a(backend):\n    q = torch.randn(3).to(dtype)\n", 1),
        ("def test_a(backend):\n    q = torch.randn(3).to(device=dev)\n", 0),
        # A test that takes a device is held to the same rule.
        ("def test_a(device):\n    q = torch.randn(3)\n", 1),
        # The CPU named outright needs its reason, as an unnamed device does.
        ("def test_a(backend):\n    q = torch.randn(3, device='cpu')\n", 1),
        ("def test_a(backend):\n    q = torch.randn(3, device='cpu')  # cpu: a host table\n", 0),
        # torch under another name, a factory imported by name, a helper method via self.
        ("import torch as T\ndef test_a(backend):\n    q = T.randn(3)\n", 1),
        ("from torch import randn\ndef test_a(backend):\n    q = randn(3)\n", 1),
        (
            "class T:\n    def make(self):\n        return torch.ones(2)\n"
            "    def test_a(self, backend):\n        self.make()\n",
            1,
        ),
    ],
)
def test_the_scan_finds_what_it_should(source, bad):
    assert len(violations(source)) == bad


def test_each_backend_gets_a_device_that_runs_it_here():
    import torch

    for backend in ("reference", "cpu", "auto", *GPU_BACKENDS):
        want = "cuda" if torch.cuda.is_available() and backend in GPU_BACKENDS else "cpu"
        assert device_of(backend) == want
