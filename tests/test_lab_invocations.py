"""How a sweep ran: a killed invocation's time from the files it wrote, and the report's
sentence (resumes, phases, the machine)."""

import os

from posemb.lab import invocations


def test_a_killed_invocation_runs_to_the_last_file_it_wrote(tmp_path):
    (tmp_path / "a.json").write_text("{}")
    os.utime(tmp_path / "a.json", (1030.0, 1030.0))
    (tmp_path / "b.json").write_text("{}")
    os.utime(tmp_path / "b.json", (2005.0, 2005.0))  # written by the next invocation
    runs = [
        {"started_unix": 1000.0, "wall_seconds": None, "phases": []},
        {"started_unix": 2000.0, "wall_seconds": 50.0, "phases": []},
    ]
    first, second = invocations.closed(runs, str(tmp_path), now=3000.0)
    assert first["interrupted"] and first["wall_seconds"] == 30.0
    assert second == runs[1]
    assert runs[0]["wall_seconds"] is None  # the records read are not changed


def test_the_sentence_names_resumes_phases_and_machine():
    machine = invocations.machine_description()
    phase = {"phase": "training", "jobs": 3, "workers": 2, "threads_per_worker": 1, "ranks": 1}
    runs = [
        {"wall_seconds": 30.0, "interrupted": True, "phases": []},
        {"wall_seconds": 12.0, "phases": [phase]},
    ]
    text = invocations.how_it_ran({"invocations": runs, "machine": machine})
    assert text.startswith("about 42 s wall over 2 invocations (resumed 1 time(s), 1 after")
    assert "this one 12 s" in text and "training: 3 job(s) on 2 worker(s) x 1 thread(s)" in text
    assert f"{machine['cores']} cores" in text and str(machine["cpu"]) in text
    one = invocations.how_it_ran({"invocations": [invocations.one_invocation(5.0, 1, 2)]})
    assert one == "5 s wall; all: ? job(s) on 1 worker(s) x 2 thread(s)"
    assert invocations.how_it_ran({"wall_seconds": 7.0}) == "7 s wall"  # an older summary
