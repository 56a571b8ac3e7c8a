"""Each job's files: an interrupted job resumes to the same numbers; a mismatched or corrupt
checkpoint is refused."""

import dataclasses
import os

import pytest
import torch

from lab_configs import TINY, crash_after
from posemb.lab import sweep


def test_interrupted_job_resumes_to_the_same_numbers(tmp_path, monkeypatch):
    whole = sweep.run_job(TINY, "rope", 0, str(tmp_path / "a"), quiet=True)
    # Crash at step 15: the step-10 checkpoint survives, no result is written.
    out = str(tmp_path / "b")
    crash_after(monkeypatch, 15, lambda: sweep.run_job(TINY, "rope", 0, out, quiet=True))
    ckpt, result = sweep.job_paths(out, "rope", 0)
    assert os.path.exists(ckpt) and not os.path.exists(result)
    assert torch.load(ckpt, weights_only=True)["step"] == 10
    resumed = sweep.run_job(TINY, "rope", 0, str(tmp_path / "b"), quiet=True)
    assert resumed["variants"] == whole["variants"]
    # A crash after training, before the result: the final checkpoint is reused, no step rerun.
    os.unlink(result)
    again = sweep.run_job(TINY, "rope", 0, str(tmp_path / "b"), quiet=True)
    assert again["variants"] == whole["variants"]
    # A finished job is not run again.
    mtime = os.path.getmtime(result)
    assert sweep.run_job(TINY, "rope", 0, str(tmp_path / "b"), quiet=True) == again
    assert os.path.getmtime(result) == mtime


def test_mismatched_or_corrupt_checkpoints_are_refused(tmp_path):
    out = str(tmp_path)
    sweep.run_job(TINY, "sinusoidal", 0, out, quiet=True)
    ckpt, result = sweep.job_paths(out, "sinusoidal", 0)
    os.unlink(result)
    with pytest.raises(ValueError, match="was made with other settings"):
        sweep.run_job(dataclasses.replace(TINY, lr=1e-3), "sinusoidal", 0, out, quiet=True)
    with open(ckpt, "wb") as f:
        f.write(b"not a checkpoint")
    with pytest.raises(ValueError, match="cannot be read"):
        sweep.run_job(TINY, "sinusoidal", 0, out, quiet=True)


def test_the_lab_names_only_its_own_files():
    from posemb.lab.checkpoints import is_lab_file

    ours = ["results.md", "race.png", "runs/rope+yarn-seed1.json"]
    ours += ["checkpoints/retrieval-rope-seed0.pt", "runs/race-rope+pi-seed0-race1.json"]
    theirs = ["my_plot.png", "runs/my-notes.json", "notes.txt", "checkpoints/rope-seed0.json"]
    theirs += ["runs/sub/rope-seed0.json", "results.md.bak"]
    assert all(is_lab_file(rel) for rel in ours)
    assert not any(is_lab_file(rel) for rel in theirs)
    # Every name a job is written under is one the lab recognises.
    for kind, race in (("lm", None), ("retrieval", None), ("race", 3)):
        for path in sweep.job_paths("out", "rope+ntk", 12, kind, race):
            assert is_lab_file(os.path.relpath(path, "out")), path
