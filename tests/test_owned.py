"""The ownership rule every file-writing command follows (posemb._owned)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import pickle

import pytest

from posemb import _owned
from posemb._owned import MANIFEST, OwnedFolder, check_output_file, probe_writable

CMD = "posemb test"


def _tree(root) -> dict[str, bytes]:
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = os.path.join(dirpath, name)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = f.read()
    return out


def test_new_folder_is_claimed_without_being_created(tmp_path):
    target = tmp_path / "a" / "b"
    folder = OwnedFolder.claim(target, CMD)
    assert not (tmp_path / "a").exists()  # the probe leaves nothing behind
    folder.write_bytes("x.txt", b"1")
    assert (target / "x.txt").read_bytes() == b"1"
    assert json.loads((target / MANIFEST).read_text())["files"].keys() == {"x.txt"}


def test_a_folder_with_a_users_file_is_refused_and_left_alone(tmp_path):
    (tmp_path / "thesis.tex").write_text("important")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "data.csv").write_text("x")
    before = _tree(tmp_path)
    with pytest.raises(ValueError, match=r"did not write.*sub/data\.csv, thesis\.tex"):
        OwnedFolder.claim(tmp_path, CMD)
    assert _tree(tmp_path) == before


def test_a_file_added_to_an_owned_folder_is_refused_and_never_pruned(tmp_path):
    folder = OwnedFolder.claim(tmp_path, CMD)
    folder.write_bytes("page.html", b"old")
    folder.write_bytes("stale.png", b"png")
    (tmp_path / "notes.md").write_text("mine")
    with pytest.raises(ValueError, match=r"did not write \(notes.md\)"):
        OwnedFolder.claim(tmp_path, CMD)
    forced = OwnedFolder.claim(tmp_path, CMD, force=True)
    forced.write_bytes("page.html", b"new")
    assert forced.prune(keep=lambda rel: rel == "page.html") == ["stale.png"]
    assert (tmp_path / "notes.md").read_text() == "mine"
    assert not (tmp_path / "stale.png").exists()


def test_an_edited_file_of_ours_is_refused_and_not_removed(tmp_path):
    folder = OwnedFolder.claim(tmp_path, CMD)
    folder.write_bytes("results.md", b"ours")
    (tmp_path / "results.md").write_text("ours, with the user's notes")
    with pytest.raises(ValueError, match=r"changed since .* wrote them \(results.md\)"):
        OwnedFolder.claim(tmp_path, CMD)
    assert folder.remove("results.md") is False
    assert (tmp_path / "results.md").read_text() == "ours, with the user's notes"


def test_write_refuses_a_file_it_did_not_write(tmp_path):
    folder = OwnedFolder.claim(tmp_path, CMD)
    (tmp_path / "theirs.txt").write_text("x")
    with pytest.raises(ValueError, match="did not write it"):
        folder.write_bytes("theirs.txt", b"y")
    assert (tmp_path / "theirs.txt").read_text() == "x"
    with pytest.raises(ValueError, match="not a file inside"):
        folder.write_bytes("../escape.txt", b"y")
    with pytest.raises(ValueError, match="not a file inside"):
        folder.write_bytes(MANIFEST, b"{}")


def test_another_commands_folder_and_a_broken_manifest_are_refused(tmp_path):
    OwnedFolder.claim(tmp_path, "posemb lab").write_bytes("a", b"1")
    with pytest.raises(ValueError, match="written by 'posemb lab'"):
        OwnedFolder.claim(tmp_path, CMD)
    for bad in (b"null", b"[]", b"[1]", b"\xff\xfe\x00", b'{"files": {"a": 1}}'):
        (tmp_path / MANIFEST).write_bytes(bad)
        with pytest.raises(ValueError, match="not a readable posemb manifest"):
            OwnedFolder.claim(tmp_path, CMD)


def test_adopt_takes_an_earlier_posembs_folder(tmp_path):
    (tmp_path / "index.html").write_text("page")
    folder = OwnedFolder.claim(tmp_path, CMD, adopt=lambda p, files: {"index.html"})
    folder.settle()
    assert set(folder.owned()) == {"index.html"}
    assert folder.prune(keep=lambda rel: False) == ["index.html"]


def test_a_crash_before_the_rename_leaves_a_valid_manifest(tmp_path):
    folder = OwnedFolder.claim(tmp_path, CMD)
    folder.write_bytes("a.txt", b"first")

    def dies(tmp):
        with open(tmp, "wb") as f:
            f.write(b"second")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        folder.write("a.txt", dies)
    assert (tmp_path / "a.txt").read_bytes() == b"first"
    assert sorted(os.listdir(tmp_path)) == [MANIFEST, "a.txt"]  # no temporary file left
    OwnedFolder.claim(tmp_path, CMD)  # still accepted


@pytest.mark.parametrize("where", ["/proc/posemb-x", "file-child", "read-only"])
def test_an_unwritable_folder_is_refused_before_any_work(tmp_path, where):
    if where == "file-child":
        (tmp_path / "f").write_text("x")
        target = str(tmp_path / "f" / "out")
    elif where == "read-only":
        if os.geteuid() == 0:
            target = "/proc/sys/posemb-x"  # root writes through mode bits; not through procfs
        else:
            ro = tmp_path / "ro"
            ro.mkdir()
            ro.chmod(0o500)
            target = str(ro / "out")
    else:
        target = where
    with pytest.raises(ValueError, match="cannot be written"):
        OwnedFolder.claim(target, CMD)
    with pytest.raises(ValueError, match="cannot be written"):
        probe_writable(target, "--out")


def test_check_output_file(tmp_path):
    mine = tmp_path / "mine.json"
    mine.write_text('[{"posemb": "x"}]')
    theirs = tmp_path / "theirs.json"
    theirs.write_text("the user's data")

    def ours(data):
        return data.startswith(b'[{"posemb"')

    check_output_file(mine, "--save", ours)
    check_output_file(tmp_path / "new.json", "--save", ours)
    with pytest.raises(ValueError, match="not an earlier output"):
        check_output_file(theirs, "--save", ours)
    check_output_file(theirs, "--save", ours, force=True)
    with pytest.raises(ValueError, match="is a folder"):
        check_output_file(tmp_path, "--save", ours)
    with pytest.raises(ValueError, match="cannot be written"):
        check_output_file(theirs / "x.json", "--save", ours)
    assert theirs.read_text() == "the user's data"


def test_a_folder_object_pickles(tmp_path):
    folder = pickle.loads(pickle.dumps(OwnedFolder.claim(tmp_path, CMD, force=True)))
    assert folder.force and folder.command == CMD
    folder.write_bytes("a", b"1")
    assert set(OwnedFolder.open(tmp_path, CMD).owned()) == {"a"}


def _write_many(args):
    path, worker = args
    folder = OwnedFolder.open(path, CMD)
    for i in range(20):
        folder.write_bytes(f"w{worker}/{i}.txt", f"{worker}-{i}".encode())


def test_concurrent_writers_lose_no_entry(tmp_path):
    OwnedFolder.claim(tmp_path, CMD)
    with mp.get_context("fork").Pool(2) as pool:
        pool.map(_write_many, [(str(tmp_path), w) for w in range(2)])
    assert len(OwnedFolder.open(tmp_path, CMD).owned()) == 40
    OwnedFolder.claim(tmp_path, CMD)  # every file listed with its hash


def test_force_never_replaces_a_file_it_did_not_write(tmp_path):
    (tmp_path / "index.html").write_text("the user's page")
    (tmp_path / "notes.txt").write_text("kept")
    with pytest.raises(ValueError, match=r"where it writes its own \(index.html\)"):
        OwnedFolder.claim(tmp_path, CMD, force=True, writes=lambda rel: rel == "index.html")
    folder = OwnedFolder.claim(tmp_path, CMD, force=True)
    with pytest.raises(ValueError, match="did not write it"):
        folder.write_bytes("index.html", b"ours")
    assert (tmp_path / "index.html").read_text() == "the user's page"


def test_a_link_to_a_folder_inside_is_not_followed_nor_written_through(tmp_path):
    root, user = tmp_path / "out", tmp_path / "userdata"
    user.mkdir()
    (user / "keep.txt").write_text("mine")
    folder = OwnedFolder.claim(root, CMD)
    folder.write_bytes("a.txt", b"1")
    (root / "runs").symlink_to(user)
    with pytest.raises(ValueError, match=r"did not write \(runs\)"):
        OwnedFolder.claim(root, CMD)
    with pytest.raises(ValueError, match="passes through the link"):
        folder.write_bytes("runs/x.json", b"{}")
    assert sorted(p.name for p in user.iterdir()) == ["keep.txt"]


@pytest.mark.parametrize("key", ["../x", "/etc/passwd", "a/../../x", "./a", ""])
def test_a_manifest_naming_a_path_outside_is_refused(tmp_path, key):
    OwnedFolder.claim(tmp_path, CMD).write_bytes("a", b"1")
    m = json.loads((tmp_path / MANIFEST).read_text())
    m["files"][key] = ["0" * 64]
    (tmp_path / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(ValueError, match="not a readable posemb manifest"):
        OwnedFolder.claim(tmp_path, CMD)


def test_an_edit_made_after_the_claim_is_not_overwritten_without_force(tmp_path):
    folder = OwnedFolder.claim(tmp_path, CMD)
    folder.write_bytes("report.md", b"v1")
    (tmp_path / "report.md").write_text("v1, with the user's notes")
    with pytest.raises(ValueError, match="changed since; not replaced"):
        folder.write_bytes("report.md", b"v2")
    assert (tmp_path / "report.md").read_text() == "v1, with the user's notes"
    OwnedFolder(tmp_path, CMD, force=True).write_bytes("report.md", b"v2")
    assert (tmp_path / "report.md").read_bytes() == b"v2"
    OwnedFolder.claim(tmp_path, CMD)


def test_repeated_crashes_mid_write_leave_a_valid_manifest(tmp_path):
    folder = OwnedFolder.claim(tmp_path, CMD)
    folder.write_bytes("a.txt", b"first")
    real = os.replace

    def no_rename(src, dst):
        if str(dst).endswith("a.txt"):
            raise KeyboardInterrupt
        return real(src, dst)

    for attempt in (b"second", b"third"):
        os.replace = no_rename
        try:
            with pytest.raises(KeyboardInterrupt):
                folder.write_bytes("a.txt", attempt)
        finally:
            os.replace = real
    OwnedFolder.claim(tmp_path, CMD)  # was: "changed since" after two such crashes
    assert (tmp_path / "a.txt").read_bytes() == b"first"


def test_a_refused_adoption_writes_nothing_and_settle_cleans_stale_temporaries(tmp_path):
    (tmp_path / "page.html").write_text("old page")
    (tmp_path / "notes.md").write_text("mine")
    with pytest.raises(ValueError, match=r"did not write \(notes\.md"):
        OwnedFolder.claim(tmp_path, CMD, adopt=lambda root, present: {"page.html"})
    assert not (tmp_path / MANIFEST).exists()
    os.unlink(tmp_path / "notes.md")
    stale = tmp_path / ".posemb-tmp-page.html.abcd1234.tmp"
    stale.write_text("half a file")
    os.utime(stale, (1, 1))
    fresh = tmp_path / ".posemb-tmp-page.html.wxyz5678.tmp"
    fresh.write_text("a write in progress")
    folder = OwnedFolder.claim(tmp_path, CMD, adopt=lambda root, present: {"page.html"})
    assert not (tmp_path / MANIFEST).exists()  # not before the command's own checks pass
    folder.settle()
    assert set(folder.owned()) == {"page.html"}
    assert not stale.exists() and fresh.exists()


def test_a_device_or_pipe_as_an_output_file_is_refused_without_reading_it():
    with pytest.raises(ValueError, match="not a regular file"):
        check_output_file("/dev/null", "--save", lambda data: True)


def test_a_second_run_into_a_held_folder_is_refused(tmp_path):
    folder = OwnedFolder.claim(tmp_path / "out", CMD)
    refused = pytest.raises(ValueError, match="being written by another posemb test run")
    with folder.running(), refused, OwnedFolder(tmp_path / "out", CMD).running():
        pass
    with OwnedFolder(tmp_path / "out", CMD).running():  # released with the first run
        pass
    OwnedFolder.claim(tmp_path / "out", CMD)  # the lock file is the command's own


def test_running_makes_the_folder_again_when_a_probe_removed_it(tmp_path, monkeypatch):
    # Two lab ranks claim one folder: one rank's probe_writable removed the folder it had just
    # made, between the other's mkdir and its open of the lock (FileNotFoundError, then a
    # gloo barrier waiting on a dead rank for 120 s).
    folder = tmp_path / "out"
    real_open, calls = os.open, []

    def flaky(path, *args, **kwargs):
        if str(path).endswith(_owned.LOCK) and not calls:
            calls.append(path)
            os.rmdir(folder)  # what the other process's probe did
            raise FileNotFoundError(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", flaky)
    with _owned.OwnedFolder(folder, "posemb test").running():
        assert (folder / _owned.LOCK).exists()
    assert calls
