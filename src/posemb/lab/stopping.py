"""A lab that is stopped stops: SIGTERM (what ``timeout``, Slurm, systemd and CI runners send)
and SIGINT end the sweep and its workers, and a worker whose parent is gone ends itself.

Before, SIGTERM killed the parent alone: its spawned workers (parent 1 then) computed their
job to the end, one evaluation at 8,192 tokens for 20 minutes after its lab was gone. Now the
sweep raises :class:`Stopped` in its main thread, the worker pool's exit terminates the
workers, and the command exits non-zero with one line. What finished is already on disk (each
job writes its result and checkpoints atomically as it goes), so the same command resumes.

A worker cannot count on its parent running any handler (SIGKILL runs none): on Linux it asks
the kernel for SIGTERM when its parent dies (``prctl(PR_SET_PDEATHSIG)``), and on any system a
thread of its own checks every second that its parent is still the one that started it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

SIGNALS = (signal.SIGTERM, signal.SIGINT)
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


class Stopped(BaseException):
    """The sweep was stopped by a signal; the jobs that finished are kept.

    A ``BaseException``, as ``KeyboardInterrupt`` is: a signal may land anywhere, and an
    ``except Exception`` on the way (reading a checkpoint) must not turn it into that code's
    own error (an attack saw "checkpoint cannot be read; delete it" for a stop)."""

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        self.name = signal.Signals(signum).name
        super().__init__(f"stopped by {self.name}")


@contextlib.contextmanager
def stopping() -> Iterator[None]:
    """While the block runs, SIGTERM and SIGINT raise :class:`Stopped` in the main thread (a
    worker pool's ``with`` then terminates its workers); the handlers before are put back
    after. Outside the main thread (where no handler can be set) it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise Stopped(signum)

    before = {s: signal.signal(s, stop) for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def children_ignore_sigint() -> Iterator[None]:
    """Processes started in the block ignore SIGINT (an ignored signal stays ignored across
    ``exec``, and Python then installs no ``KeyboardInterrupt``). Ctrl-C reaches the terminal's
    whole process group: the workers printed a traceback each (about 30 lines) while this
    process, the one that answers it, ended them anyway. Outside the main thread it changes
    nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def workers_can_start() -> bool:
    """Whether a spawned worker can start here. Spawn runs the parent's ``__main__`` again in
    each worker, by its module name or from its file; a script read from standard input
    (``python - <<EOF``) has neither (its file is "<stdin>"), so each worker died at start and
    ``multiprocessing.Pool`` started another in its place, forever: a hang at full CPU. The lab
    then runs its jobs in this process."""
    import multiprocessing.process

    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None):
        return True
    path = getattr(main, "__file__", None)
    if path is None:  # an interactive session or python -c: nothing is run again
        return True
    start = getattr(multiprocessing.process, "ORIGINAL_DIR", None) or os.getcwd()
    return os.path.isfile(os.path.join(start, path))


def die_with_parent(parent: int) -> None:
    """In a worker process: end it when ``parent``, the process that started it (its pid given
    by that process: a worker still importing when its parent died has another parent by the
    time this runs), is gone. A worker pool's ``initializer``."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        except (OSError, AttributeError):  # no prctl: the thread below still watches
            pass
    if os.getppid() != parent:  # the parent died before the kernel was asked
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="posemb-parent-watch", daemon=True).start()


__all__ = ["SIGNALS", "Stopped", "die_with_parent", "stopping", "workers_can_start"]
