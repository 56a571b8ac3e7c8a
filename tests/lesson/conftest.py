"""Shared by the lesson's tests: the figures built once, and a way to break what a claim checks."""

import importlib

import pytest

from posemb.lab.schema import LabSummary
from posemb.lesson import claims, measure


@pytest.fixture(scope="session")
def by_id(built_figures):
    """Every built figure by id."""
    return {f.id: f for f in built_figures}


def claim_by_id(claim_id):
    return next(c for c in claims.CLAIMS if c.id == claim_id)


@pytest.fixture(scope="session")
def claim_of():
    """``claim_of(id)``: the registered claim with that id."""
    return claim_by_id


@pytest.fixture
def broken(monkeypatch):
    """``broken(claim_id, name, fault)``: assert the claim holds, replace ``name`` where its
    check looks it up (its screen module and :mod:`posemb.lesson.measure`), and return whether
    it still holds."""

    def run(claim_id, name, fault):
        claim = claim_by_id(claim_id)
        assert claim.run()["passed"], claim_id
        where = [importlib.import_module(claim.check.__module__), measure]
        patched = [m for m in where if hasattr(m, name)]
        assert patched, f"{name} is used neither by {claim.check.__module__} nor by measure"
        for module in patched:
            monkeypatch.setattr(module, name, fault)
        return claim.run()["passed"]

    return run


@pytest.fixture
def fake_lab():
    """``fake_lab(rope_flat=, sinusoidal_flat=, yarn_flat=)``: a lab summary in the shipped
    form, with chosen curves flat (as long past the training length as within it), read as
    :func:`posemb.lesson.measure.lab_summary` returns it."""
    real = measure.lab_summary().data

    def make(rope_flat=False, sinusoidal_flat=False, yarn_flat=False):
        def cells(within, past):
            out = {str(real["config"]["train_len"]): {"all": {"mean": within, "std": 0.0, "n": 2}}}
            for n in real["config"]["eval_lens"][1:]:
                out[str(n)] = {
                    "all": {"mean": past, "std": 0.0},
                    "past": {"mean": past, "std": 0.0},
                }
            return out

        fake = dict(real)
        fake["results"] = dict(real["results"])
        if rope_flat:
            fake["results"]["rope"] = cells(1.6, 1.6)
        if sinusoidal_flat:
            fake["results"]["sinusoidal"] = cells(1.7, 1.7)
        if yarn_flat:  # scaling that restores the within-length loss everywhere
            within = real["results"]["rope"][str(real["config"]["train_len"])]["all"]["mean"]
            fake["results"]["rope+yarn"] = cells(within, within)
        return LabSummary.of(fake)

    return make
