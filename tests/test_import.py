import subprocess
import sys

HEAVY = ("transformers", "rotary_embedding_torch", "hypothesis", "matplotlib", "triton")


def test_import_posemb_loads_no_optional_dependency():
    code = (
        "import sys, posemb\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_public_names():
    import posemb

    for name in posemb.__all__:
        assert hasattr(posemb, name), name
