import inspect
import subprocess
import sys
import types

import pytest

import posemb

HEAVY = ("transformers", "rotary_embedding_torch", "hypothesis", "matplotlib", "triton")


def test_import_posemb_loads_no_optional_dependency():
    code = (
        "import sys, posemb\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_all_lists_exactly_the_public_api_and_documents_it():
    exported = {
        name
        for name, value in vars(posemb).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert set(posemb.__all__) - {"hf", "scaling", "temperature", "__version__"} == exported
    for name in exported:
        value = getattr(posemb, name)
        if inspect.isfunction(value) or inspect.isclass(value):
            assert inspect.getdoc(value), f"posemb.{name} has no docstring"
            assert value.__module__.startswith("posemb."), name


def test_no_name_means_two_things():
    """posemb.attention is the module; the reference function has its own name."""
    assert isinstance(posemb.attention, types.ModuleType)
    assert callable(posemb.dot_product_attention)
    assert "attention" not in posemb.__all__


@pytest.mark.parametrize("old,new", [("ALiBi", "AlibiBias"), ("T5RelativeBias", "T5Bias")])
def test_renamed_names_still_work_with_a_warning(old, new):
    with pytest.warns(DeprecationWarning, match=f"posemb.{old} is renamed posemb.{new}"):
        assert getattr(posemb, old) is getattr(posemb, new)
    with pytest.raises(AttributeError):
        posemb.NoSuchThing  # noqa: B018
