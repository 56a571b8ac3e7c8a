"""A lab that is stopped stops (issue 56, bug 4): SIGTERM to a running ``posemb lab`` leaves no
process of it alive a few seconds later and the same command resumes; a worker whose parent
is killed outright (SIGKILL: no handler runs) ends itself. A real process tree: the command in
a subprocess, its spawned workers found through /proc."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _start(out):
    argv = [sys.executable, "-m", "posemb", "lab", "--quick", "--tasks", "lm", "--variants",
            "rope", "sinusoidal", "--steps", "300", "--out", str(out)]  # fmt: skip
    return argv, subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def _workers(proc, least=2, within=90.0):
    """The lab's worker processes (spawned: python children that are not the resource
    tracker), once at least ``least`` of them run."""
    until = time.monotonic() + within
    while time.monotonic() < until:
        kids = [k for k in _children(proc.pid) if "resource_tracker" not in _cmdline(k)]
        if len(kids) >= least:
            return kids
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.2)
    raise AssertionError("the lab's workers did not start")


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _gone(pids, within=5.0):
    until = time.monotonic() + within
    while time.monotonic() < until:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def test_sigterm_ends_the_lab_and_its_workers_and_the_command_then_resumes(tmp_path):
    out = tmp_path / "lab"
    argv, proc = _start(out)
    kids = _workers(proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=5) == 128 + signal.SIGTERM
    assert _gone([proc.pid, *kids]), [k for k in kids if _alive(k)]
    said = [line for line in proc.stderr.read().splitlines() if line.startswith("posemb lab")]
    assert said == [
        f"posemb lab: stopped by SIGTERM; the finished jobs are kept in {out}: run the same "
        f"command to resume"
    ]
    again = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert (out / "results.json").exists()


def test_a_worker_whose_parent_is_killed_ends_itself(tmp_path):
    _, proc = _start(tmp_path / "lab")
    kids = _workers(proc)
    proc.kill()  # SIGKILL: the parent runs no handler at all
    proc.wait(timeout=5)
    # A worker still importing torch when its parent died ends once it can check (no bound
    # but that it ends: the 5 s is SIGTERM's).
    assert _gone(kids, within=30.0), [k for k in kids if _alive(k)]


def test_a_stop_while_a_checkpoint_is_read_stays_a_stop(tmp_path, monkeypatch):
    """An attack: SIGTERM landing inside torch.load became "checkpoint cannot be read
    (Stopped); delete it" (load_checkpoint's `except Exception` took it): a good checkpoint
    named for deletion, exit 2 instead of 143 and the resume line."""
    import torch

    from posemb.lab import checkpoints
    from posemb.lab.stopping import Stopped, stopping

    path = tmp_path / "job.pt"
    torch.save({"digest": "d", "x": torch.zeros(3)}, path)
    real = torch.load

    def interrupted(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # delivered before the read finishes
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "load", interrupted)
    with pytest.raises(Stopped, match="SIGTERM"), stopping():
        checkpoints.load_checkpoint(str(path), "d")
    assert path.exists()


def test_workers_started_for_the_sweep_ignore_ctrl_c():
    """Ctrl-C reaches the whole process group: the workers printed a KeyboardInterrupt
    traceback each while the sweep ended them anyway. Started inside the block, a process
    ignores SIGINT; after it, SIGINT is this process's again."""
    from posemb.lab.stopping import children_ignore_sigint

    code = "import signal; print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)"
    before = signal.getsignal(signal.SIGINT)
    with children_ignore_sigint():
        inside = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    after = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert (inside.stdout.strip(), after.stdout.strip()) == ("True", "False")
    assert signal.getsignal(signal.SIGINT) is before


def test_the_sweeps_worker_pool_is_started_ignoring_ctrl_c(tmp_path, monkeypatch):
    """The pool's workers inherit SIGINT ignored (they are started inside
    children_ignore_sigint), and this process answers SIGINT again after."""
    import dataclasses

    from posemb.lab import sweep

    seen = []

    class Refused(Exception):
        pass

    class Context:
        def Pool(self, *args, **kwargs):  # multiprocessing's name
            seen.append(signal.getsignal(signal.SIGINT))
            raise Refused

    monkeypatch.setattr(sweep.mp, "get_context", lambda method: Context())
    cfg = dataclasses.replace(
        sweep.quick_config(), variants=("rope", "nope"), tasks=("lm",), workers=2
    )
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(Refused):
        sweep._phases(cfg, str(tmp_path), 0, 1, False, True)
    assert seen == [signal.SIG_IGN]
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.parametrize(
    ("main", "can"),
    [
        ({"__file__": "<stdin>"}, False),  # python - <<EOF: nothing to run again
        ({"__file__": __file__}, True),
        ({}, True),  # python -c, or an interactive session: nothing is run again
        ({"__file__": "<stdin>", "__spec__": type("Spec", (), {"name": "mine"})()}, True),
    ],
)
def test_workers_can_start_only_where_spawn_can_run_main_again(monkeypatch, main, can):
    import types

    from posemb.lab.stopping import workers_can_start

    fake = types.ModuleType("__main__")
    fake.__spec__ = None
    for name, value in main.items():
        setattr(fake, name, value)
    monkeypatch.setitem(sys.modules, "__main__", fake)
    assert workers_can_start() is can


# Each worker would die at start (no <stdin> to run again), and multiprocessing.Pool started
# another in its place forever: these hung at full CPU until killed.
_FROM_STDIN = {
    "dog bites man": """
from posemb.lab import dog_bites_man as d
print(d.memorisation(seeds=(0,), encodings=("alibi", "t5"))["alibi"]["train"])
""",
    "sweep": """
import dataclasses, sys
sys.path.insert(0, {tests!r})
from lab_configs import TINY
from posemb.lab import sweep
s = sweep.run(dataclasses.replace(TINY, workers=2), {out!r}, quiet=False)
print([p["workers"] for p in s["invocations"][-1]["phases"]])
""",
}


@pytest.mark.parametrize("name", list(_FROM_STDIN))
def test_a_script_read_from_stdin_runs_its_jobs_in_its_own_process(tmp_path, name):
    script = _FROM_STDIN[name].format(tests=os.path.dirname(__file__), out=str(tmp_path / "o"))
    done = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True,
                          timeout=240, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "FileNotFoundError" not in done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last == ("[1.0]" if name == "dog bites man" else "[1]"), done.stdout
    if name == "sweep":
        assert "no worker process can start" in done.stderr


def test_a_script_without_a_main_guard_fails_instead_of_hanging(tmp_path):
    """Each spawned worker runs such a script again, which starts a pool of its own and dies;
    multiprocessing.Pool replaced it forever. The claims' pool now raises instead."""
    script = tmp_path / "unguarded.py"
    script.write_text("from posemb.lab import dog_bites_man as d\n"
                      "print(d.memorisation(seeds=(0,), encodings=('alibi', 't5')))\n")  # fmt: skip
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=240, cwd=tmp_path)  # fmt: skip
    assert done.returncode != 0
    assert "BrokenProcessPool" in done.stderr, done.stderr[-3000:]
