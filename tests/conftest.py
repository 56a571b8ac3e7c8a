import contextlib
import dataclasses
import fcntl
import json
import os
import pathlib
import pickle
import time
from collections.abc import Iterator

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

# What a worker must run together (make test: -n 2 --dist loadfile): a test module's tests
# share module-scoped fixtures and, in test_front_door.py, state from one test to the next, so
# each module is one unit of work. What takes minutes and several modules need (every claim
# run, the lesson page built) is made once per run for every worker (_once, below), so the
# lesson's and the site's modules spread over both workers.
# The units that take minutes each (fresh environments, the wheel, the lesson in a browser)
# start first, so that no worker is left with one of them at the end.
_LONG = (
    "tests/lesson/test_a11y.py",  # asks for the claims first: the others wait on them less
    "tests/test_wheel.py",
    "tests/test_front_door.py",
    "tests/lesson/test_browser.py",
    "tests/test_docs.py",
    "tests/test_lab_sweep.py",
)


def _unit(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _rank(nodeid: str) -> int:
    unit = _unit(nodeid)
    return _LONG.index(unit) if unit in _LONG else len(_LONG)


def pytest_collection_modifyitems(config, items):
    """The long units first (the order xdist hands units out in); stable otherwise."""
    items.sort(key=lambda item: _rank(item.nodeid))


# POSEMB_TEST_TIMELINE=file: each worker appends "worker start end cpu nodeid" per test, to
# see where a run's time goes and where a worker waits (scripts/test_timeline.py sums it). cpu
# is the test's processor seconds, its own threads' and its finished subprocesses': on a
# machine whose cores are all busy, wall time says who waited, cpu says who made them wait.
_TIMELINE = os.environ.get("POSEMB_TEST_TIMELINE")


def _records() -> bool:
    """A worker, or a run without workers: xdist's controller replays its workers' hooks."""
    return bool(_TIMELINE) and ("PYTEST_XDIST_WORKER" in os.environ or not _CONTROLLER)


_CONTROLLER = False
_started: dict[str, tuple[float, float]] = {}  # nodeid -> (when its setup began, cpu then)


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def pytest_configure(config):
    global _CONTROLLER
    # -n N without a worker's input: the process that hands out the tests and runs none.
    _CONTROLLER = bool(getattr(config.option, "numprocesses", None)) and not hasattr(
        config, "workerinput"
    )


def pytest_runtest_logstart(nodeid, location):
    if _records():
        # Only the process that runs tests records: a pytest a test starts is not this run's.
        os.environ.pop("POSEMB_TEST_TIMELINE", None)
        _started[nodeid] = (time.time(), _cpu())


def pytest_runtest_logfinish(nodeid, location):
    if _records():
        started, cpu = _started.pop(nodeid, (float("nan"), float("nan")))
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(_TIMELINE, "a") as f:
            f.write(f"{worker} {started:.3f} {time.time():.3f} {_cpu() - cpu:.2f} {nodeid}\n")


@contextlib.contextmanager
def _once(tmp_path_factory, name: str) -> Iterator[pathlib.Path]:
    """A path every pytest-xdist worker of this run shares (the one session folder above the
    workers' own), held under an exclusive lock: the first worker to get here makes the file,
    the others wait, then read it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield root / name
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def claims_file(tmp_path_factory) -> pathlib.Path:
    """Every claim run once per test run (about a minute), whichever worker asks first, saved
    as ``posemb verify --save`` saves them: the CLI's, the lesson's and the site's tests read
    it, and the front door's ``make demo`` takes it as its checkout's claims."""
    with _once(tmp_path_factory, "claims.json") as path:
        if not path.exists():
            from posemb.lesson import claims

            text = json.dumps(claims.run_all(), indent=2)
            path.with_suffix(".tmp").write_text(text, encoding="utf-8")
            os.replace(path.with_suffix(".tmp"), path)
    return path


@pytest.fixture(scope="session")
def claim_rows(claims_file):
    """The claim rows of this run (:func:`claims_file`)."""
    return json.loads(claims_file.read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def built_figures(tmp_path_factory):
    """Every lesson figure built once per run (about 10 s), whichever worker asks first: the
    figure, page and screen tests of both workers share them (plain data, pickled)."""
    pytest.importorskip("altair")
    pytest.importorskip("vl_convert")
    from posemb.lesson import figures

    with _once(tmp_path_factory, "figures.pickle") as path:
        if not path.exists():
            path.with_suffix(".tmp").write_bytes(pickle.dumps(figures.build_figures()))
            os.replace(path.with_suffix(".tmp"), path)
        return pickle.loads(path.read_bytes())


@pytest.fixture(scope="session")
def lesson_build(tmp_path_factory, claim_rows):
    """The lesson page built once per run from the shared claim rows, into a folder every
    worker reads (no test writes into it)."""
    pytest.importorskip("jinja2")
    pytest.importorskip("vl_convert")
    from posemb.lesson import page

    with _once(tmp_path_factory, "lesson.json") as record:
        if not record.exists():
            built = page.build_lesson(record.with_name("posemb-lesson"), claim_rows)
            fields = {f.name: getattr(built, f.name) for f in dataclasses.fields(built)}
            text = json.dumps(fields, default=str)
            record.with_suffix(".tmp").write_text(text, encoding="utf-8")
            os.replace(record.with_suffix(".tmp"), record)
        fields = json.loads(record.read_text(encoding="utf-8"))
    return page.LessonBuild(
        folder=pathlib.Path(fields["folder"]),
        index=pathlib.Path(fields["index"]),
        failed=tuple(fields["failed"]),
        seconds=fields["seconds"],
        bytes=fields["bytes"],
    )


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
