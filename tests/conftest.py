import os
import pathlib

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

# What a worker must run together (make test: --dist loadgroup). A test module's tests share
# module-scoped fixtures and, in test_front_door.py, state from one test to the next: each
# module is one group. The lesson's tests and the site's share session fixtures that take
# minutes (every claim run, every figure, the page built): they are one group.
_SHARED_SESSION = ("lesson/", "test_docs.py")


# The groups that take minutes each (fresh environments, the wheel, the lesson's claims and
# page in a browser) start first, so that no worker is left with one of them at the end.
_LONG = ("test_front_door.py", "test_wheel.py", "lesson-and-site", "test_lab_tasks.py")


def pytest_collection_modifyitems(config, items):
    """Give each test its xdist group (see above), the long groups first; inert without
    pytest-xdist."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    root = pathlib.Path(__file__).parent
    groups = {}
    for item in items:
        rel = item.path.relative_to(root).as_posix()
        group = "lesson-and-site" if rel.startswith(_SHARED_SESSION) else rel
        item.add_marker(pytest.mark.xdist_group(group))
        groups[item.nodeid] = group
    # Stable: within a group, and among the rest, the collection order stands.
    items.sort(key=lambda it: _LONG.index(g) if (g := groups[it.nodeid]) in _LONG else len(_LONG))


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
