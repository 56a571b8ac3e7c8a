"""Screen 4: the logit depends on m - n; the claims fail when rotations stop composing."""

import math

import torch

import posemb
from posemb.rope import rotation_matrix

F64 = torch.float64


def test_the_norm_claim_fails_when_rope_keeps_its_loss(broken, fake_lab):
    flat = fake_lab(rope_flat=True)
    assert not broken("rope.norm_kept_but_not_seamless", "lab_summary", lambda: flat)


def test_the_composition_claim_fails_when_angles_are_not_linear_in_position(broken):
    def bent(m, theta, *args, **kw):
        return rotation_matrix(m + m * m * 1e-9, theta, *args, **kw)

    assert not broken("rope.relative_composition", "rotation_matrix", bent)


def test_the_dials_show_the_rotated_logit(by_id):
    q = torch.randn(2, generator=torch.Generator().manual_seed(41), dtype=F64)
    theta = torch.tensor([math.pi / 4], dtype=F64)
    for m, n in ((5, 2), (6, 3), (0, 6)):
        logit = float(
            (posemb.rotation_matrix(m, theta) @ q) @ (posemb.rotation_matrix(n, theta) @ q)
        )
        assert by_id["fig-dials-mn"].readouts[f"{m}|{n}"].endswith(f"= {logit:.6f}")
    # Shifting both keeps the logit: the readouts of (5, 2) and (6, 3) agree.
    a, b = (by_id["fig-dials-mn"].readouts[s].split("= ")[-1] for s in ("5|2", "6|3"))
    assert a == b
