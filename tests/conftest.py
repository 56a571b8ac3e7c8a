import os

from hypothesis import HealthCheck, settings

# A fixed, modest budget keeps the whole suite under a few minutes on 2 cores and makes CI
# failures reproducible (derandomize) rather than flaky.
settings.register_profile(
    "posemb",
    max_examples=int(os.environ.get("POSEMB_HYPOTHESIS_EXAMPLES", "40")),
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("posemb")

# The Triton kernel is tested on the CPU through Triton's interpreter; this must be set before
# triton is first imported, and only where no GPU would run it for real.
try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:  # pragma: no cover
    pass


import pytest  # noqa: E402

# make test runs two pytest-xdist workers (one per core of the project's 2-core machines):
# each then computes on one thread, not two threads each on two cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
    import torch

    torch.set_num_threads(1)

# What a worker must run together (make test: -n 2 --dist loadfile). A test module's tests
# share module-scoped fixtures and, in test_front_door.py, state from one test to the next:
# each module is one unit of work. The lesson's tests and the site's share session fixtures
# that take minutes (every claim run, every figure, the page built): they are one unit.
# (xdist's own --dist loadgroup did not group anything with pytest 9.2 and xdist 3.8.)
_SHARED_SESSION = ("tests/lesson/", "tests/test_docs.py")
# The units that take minutes each (fresh environments, the wheel, the lesson in a browser)
# start first, so that no worker is left with one of them at the end.
_LONG = ("tests/test_front_door.py", "tests/test_wheel.py", "lesson-and-site")


def _unit(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return "lesson-and-site" if path.startswith(_SHARED_SESSION) else path


def _rank(nodeid: str) -> int:
    unit = _unit(nodeid)
    return _LONG.index(unit) if unit in _LONG else len(_LONG)


def pytest_collection_modifyitems(config, items):
    """The long units first (the order xdist hands units out in); stable otherwise."""
    items.sort(key=lambda item: _rank(item.nodeid))


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, absent where it is not installed
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile with the lesson's and the site's modules as one unit."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return Scheduling(config, log)


@pytest.fixture(scope="session")
def claim_rows():
    """Every claim run once per session (about a minute): the CLI and lesson tests share it."""
    from posemb.lesson import claims

    return claims.run_all()


@pytest.fixture(scope="session")
def built_figures():
    """Every lesson figure built once per session (the figure, page and screen tests share it)."""
    pytest.importorskip("altair")
    pytest.importorskip("vl_convert")
    from posemb.lesson import figures

    return figures.build_figures()


@pytest.fixture(scope="session")
def lesson_build(tmp_path_factory, claim_rows):
    """The lesson page built once per session from the shared claim rows."""
    pytest.importorskip("jinja2")
    pytest.importorskip("vl_convert")
    from posemb.lesson import page

    return page.build_lesson(tmp_path_factory.mktemp("lesson") / "posemb-lesson", claim_rows)


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium driven by Playwright, launched once per test module (the lesson's and
    the site's browser tests; a second sync_playwright in the same thread would fail)."""
    from browser import browser_or_skip

    chromium = browser_or_skip()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        # --no-sandbox: CI containers run as root, where Chromium's sandbox cannot start.
        launched = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture
def triton_decode_path_on_this_host(monkeypatch):
    """The CUDA decode fast path exercised on this host's device: "auto" resolves to Triton
    and the path's CUDA test accepts these tensors (on a CPU host, through the interpreter);
    the CPU op's own fast path is kept out."""
    from devices import device_of
    from posemb.kernels import dispatch, fast, triton_path

    device = device_of("triton")
    real_resolve = dispatch.resolve_backend

    def plain(q, k):  # triton_path.plain with this host's device for CUDA's
        return (
            type(q) is torch.Tensor
            and type(k) is torch.Tensor
            and q.device.type == torch.device(device).type
            and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad))
            and not torch.compiler.is_compiling()
        )

    monkeypatch.setattr(triton_path, "plain", plain)
    monkeypatch.setattr(fast, "plain", lambda q, k: False)
    monkeypatch.setattr(
        dispatch,
        "resolve_backend",
        lambda b, x: "triton" if b == "auto" and x.dtype != torch.float64 else real_resolve(b, x),
    )
    triton_path.forget()
    yield device
    triton_path.forget()
