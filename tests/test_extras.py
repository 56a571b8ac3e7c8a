"""A feature whose optional dependency is missing fails at the door: the command exits 2 with one
line naming the extra to install, the API raises an ImportError saying the same, and nothing is
computed or written first. Each module is hidden in a fresh interpreter (``sys.modules[name] =
None`` makes its import fail as a missing module does)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from posemb import _extras


def _run(hidden: str, code: str) -> subprocess.CompletedProcess:
    prelude = f"import sys\nsys.modules[{hidden!r}] = None\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True
    )


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("hidden", ["jinja2", "altair", "vl_convert", "matplotlib"])
def test_posemb_lesson_without_the_lesson_extra(hidden, tmp_path):
    out = tmp_path / "page"
    done = _run(
        hidden, f"from posemb import cli; sys.exit(cli.main(['lesson', '--out', {str(out)!r}]))"
    )
    assert done.returncode == 2, done.stderr
    line = _one_line(done.stderr)
    assert line.startswith("posemb lesson: error: posemb lesson needs ")
    assert line.endswith("which is not installed: pip install 'posemb[lesson]'")
    assert not out.exists()


def test_the_lesson_figures_module_says_which_extra():
    done = _run(
        "altair",
        """
        try:
            import posemb.lesson.figures
        except ImportError as err:
            print(type(err).__name__, err)
        """,
    )
    assert done.stdout.strip() == (
        "MissingExtra posemb's lesson figures needs altair, which is not installed: "
        "pip install 'posemb[lesson]'"
    )


def test_posemb_convert_without_safetensors(tmp_path):
    argv = ["convert", str(tmp_path / "in.safetensors"), str(tmp_path / "out.safetensors"),
            "--to", "half", "--num-heads", "4"]  # fmt: skip
    done = _run("safetensors", f"from posemb import cli; sys.exit(cli.main({argv!r}))")
    assert done.returncode == 2, done.stderr
    assert _one_line(done.stderr) == (
        "posemb convert: error: posemb convert needs safetensors, which is not installed: "
        "pip install 'posemb[hf]'"
    )


def test_posemb_lab_without_matplotlib_stops_before_training(tmp_path):
    out = tmp_path / "lab"
    done = _run(
        "matplotlib",
        f"from posemb import cli; sys.exit(cli.main(['lab', '--quick', '--out', {str(out)!r}]))",
    )
    assert done.returncode == 2, done.stderr
    assert _one_line(done.stderr) == (
        "posemb lab: error: posemb lab (its plots) needs matplotlib, which is not installed: "
        "pip install 'posemb[lab]'"
    )
    assert not out.exists()


def test_a_config_that_needs_transformers_defaults_names_the_extra():
    done = _run(
        "transformers",
        """
        from posemb import hf
        config = {"model_type": "gemma3_text", "hidden_size": 64, "num_attention_heads": 4,
                  "head_dim": 16, "num_hidden_layers": 2}
        try:
            hf.model_rope(config)
        except ImportError as err:
            print(type(err).__name__, err)
        """,
    )
    assert done.stdout.startswith("MissingExtra "), done.stdout + done.stderr
    assert "pip install 'posemb[hf]'" in done.stdout


def test_the_triton_backend_names_its_extra():
    done = _run("triton", "from posemb import kernels; print(kernels.triton_unavailable_reason())")
    assert done.stdout.strip() == (
        "the Triton backend needs triton, which is not installed: pip install 'posemb[triton]'"
    )


def test_a_broken_dependency_is_not_called_missing(tmp_path):
    """Only an absent module is 'missing': an ImportError raised inside an installed one is a
    real error and propagates as it is."""
    fake = tmp_path / "altair"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('altair is broken here')\n")
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
        "try:\n    import posemb.lesson.figures\n"
        "except ImportError as err:\n    print(type(err).__name__, err)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "ImportError altair is broken here"


def test_require_returns_the_module_or_names_the_extra():
    assert _extras.require("json", "a test").__name__ == "json"
    with pytest.raises(
        _extras.MissingExtra,
        match=r"needs no_such_module_here, which is not installed: pip install .posemb\[jit\]",
    ):
        _extras.require("no_such_module_here", "a test", "jit")
    assert issubclass(_extras.MissingExtra, ImportError)
