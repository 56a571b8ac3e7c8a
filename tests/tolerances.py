"""Per-dtype tolerances for comparing a result against a float64 (or float32) reference.

Derived, not tuned: u is the unit roundoff of the dtype (half its machine epsilon). posemb's
paths compute in float32 or better and round once to the output dtype, so a correct result is
within one rounding (u relative) of the exact value, and two correct results within 2u of each
other. A few float32 operations before the final rounding add O(10) float32 roundoffs, which
is below u for the half types and is what the float32 row allows for. The factor 4 leaves room
for values near zero where relative error is undefined (hence atol = rtol * |typical value|,
and the test inputs are standard normal, |x| ~ 1).
"""

from __future__ import annotations

import torch

UNIT_ROUNDOFF = {
    torch.float64: 2.0**-53,
    torch.float32: 2.0**-24,
    torch.bfloat16: 2.0**-8,
    torch.float16: 2.0**-11,
}

# float32 results come from a short chain of float32 operations (the product, one add):
# allow 16 roundoffs rather than 4.
_OPS = {torch.float64: 64, torch.float32: 16, torch.bfloat16: 4, torch.float16: 4}

TOL = {dt: {"rtol": _OPS[dt] * u, "atol": _OPS[dt] * u} for dt, u in UNIT_ROUNDOFF.items()}

# A second derivative (the derivative of a backward) is a chain about four times as long as
# the forward it comes from (forward, backward, and the derivative of each), its terms summed
# over every key: four times the roundoffs of the first row.
TOL_SECOND = {dt: {"rtol": 4 * t["rtol"], "atol": 4 * t["atol"]} for dt, t in TOL.items()}


def assert_close_at_scale(
    actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, table: dict = TOL
) -> None:
    """As :func:`assert_close`, with the absolute part taken at the scale of ``expected``
    (its largest magnitude) rather than of a standard normal: for results far from order one,
    such as second derivatives, whose entries cancel from terms of that size."""
    scale = max(1.0, float(expected.abs().max()))
    tol = table[dtype]
    torch.testing.assert_close(
        actual.to(torch.float64),
        expected.to(torch.float64),
        rtol=tol["rtol"],
        atol=tol["atol"] * scale,
    )


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    """Assert ``actual`` matches ``expected`` within the table's tolerance for ``dtype``."""
    torch.testing.assert_close(actual.to(torch.float64), expected.to(torch.float64), **TOL[dtype])
