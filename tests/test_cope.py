"""CoPE (Golovneva et al. 2024, arXiv:2405.18719) against the paper's Eq. 3-5 written as loops."""

from __future__ import annotations

import copy
import math
import pickle

import pytest
import torch

from posemb._errors import InputError
from posemb.cope import CoPE, cope_positions
from tolerances import TOL, assert_close

F64 = torch.float64
NEG_INF = float("-inf")


def sigmoid(x: float) -> float:
    """The gate of Eq. 3 for one logit; 0 for a masked (-inf) one, without overflowing exp."""
    if x == NEG_INF:
        return 0.0
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def reference(
    q: torch.Tensor, logits: torch.Tensor, table: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions (Eq. 4, clamped) and logits q_i . e[p_ij] (Eq. 5), one (i, j) at a time.

    Eq. 5 is applied to the table rows themselves and only then dotted with q, where the code
    under test dots first and interpolates scalars. A masked entry's logit is 0 (documented).
    """
    q, logits, table = q.to(F64), logits.to(F64), table.to(F64)
    batch, heads, q_len, k_len = logits.shape
    top = table.shape[0] - 1
    pos = torch.zeros(batch, heads, q_len, k_len, dtype=F64)
    out = torch.zeros_like(pos)
    for b in range(batch):
        for h in range(heads):
            for i in range(q_len):
                for j in range(k_len):
                    row = [float(x) for x in logits[b, h, i]]
                    p = min(sum(sigmoid(x) for x in row[j:]), top)
                    lo, hi = math.floor(p), math.ceil(p)
                    e = (1 - (p - lo)) * table[lo] + (p - lo) * table[hi]
                    pos[b, h, i, j] = p
                    if row[j] != NEG_INF:
                        out[b, h, i, j] = float(q[b, h, i] @ e)
    return pos, out


def masked(batch: int, heads: int, q_len: int, k_len: int, causal: bool) -> torch.Tensor:
    """True where masked: causal (queries are the last q_len keys) or not, the last two keys of
    batch row 1 padding, and every key of query 0 of (batch 0, head 1) masked."""
    m = torch.zeros(batch, heads, q_len, k_len, dtype=torch.bool)
    if causal:
        i = torch.arange(q_len).unsqueeze(-1) + (k_len - q_len)
        m |= torch.arange(k_len) > i
    m[1, :, :, -2:] = True
    m[0, 1, 0, :] = True
    return m


def case(causal: bool, dtype: torch.dtype = F64, q_len: int = 5, k_len: int = 5, seed: int = 0):
    """Standard normal q and logits (x2, so gates spread over (0, 1)) with a mask applied."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 2, q_len, 4, generator=g, dtype=F64).to(dtype)
    logits = (2 * torch.randn(2, 2, q_len, k_len, generator=g, dtype=F64)).to(dtype)
    mask = masked(2, 2, q_len, k_len, causal)
    return q, logits.masked_fill(mask, NEG_INF), mask


def module(max_positions: int, head_dim: int = 4) -> CoPE:
    torch.manual_seed(1)
    return CoPE(head_dim, max_positions, init_std=1.0)  # |e| ~ 1: the table's atol assumes it


@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("max_positions", [3, 16])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_positions_match_the_loops(causal, max_positions, dtype):
    _, logits, _ = case(causal, dtype)
    pos = cope_positions(logits, max_positions)
    want, _ = reference(torch.zeros(2, 2, 5, 4), logits, torch.zeros(max_positions, 4))
    assert pos.shape == logits.shape
    assert pos.dtype == (F64 if dtype == F64 else torch.float32)  # never rounded to bfloat16
    # Computed in float32 from the given (already rounded) logits: float32's row for both.
    assert_close(pos, want, F64 if dtype == F64 else torch.float32)
    assert float(pos.min()) >= 0.0 and float(pos.max()) <= max_positions - 1
    if max_positions == 3:
        assert float(want.max()) == 2.0  # the clamp is exercised


@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("max_positions", [3, 16])
@pytest.mark.parametrize(
    "causal,q_len", [(True, 5), (False, 5), (True, 3)], ids=["causal", "bidirectional", "decode"]
)
def test_logits_match_the_loops(causal, q_len, max_positions, dtype):
    q, logits, mask = case(causal, dtype, q_len=q_len)
    cope = module(max_positions)
    out = cope(q, logits)
    _, want = reference(q, logits, cope.embedding.detach())
    assert out.shape == logits.shape and out.dtype == dtype
    assert_close(out, want, dtype)
    assert bool((out[mask] == 0).all())
    total = logits + out
    assert bool(torch.isneginf(total[mask]).all()) and bool(torch.isfinite(total[~mask]).all())


def test_a_decoding_query_gets_the_last_row_of_the_full_pass():
    q, logits, _ = case(causal=True, dtype=torch.float32)
    cope = module(16)
    torch.testing.assert_close(cope(q[:, :, -1:], logits[:, :, -1:]), cope(q, logits)[:, :, -1:])


@pytest.mark.parametrize("dtype", [F64, torch.float32])
@pytest.mark.parametrize("max_positions", [4, 16])
def test_saturated_gates_count_relative_distance(dtype, max_positions):
    """All gates 1: Eq. 4 counts the keys from j to the row's end. With a causal mask that is
    i - j + 1 (the query itself is at position 1, the key before it at 2, ...), 0 for a future
    key; without a mask it is k_len - j. Integer positions read table rows exactly (w = 0)."""
    n = 6
    huge = torch.full((1, 1, n, n), 1e4, dtype=dtype)  # sigmoid(1e4) is 1.0 in any dtype
    i, j = torch.arange(n).unsqueeze(-1), torch.arange(n)
    causal = huge.masked_fill(j > i, NEG_INF)
    counted = torch.where(j <= i, i - j + 1, 0).clamp(max=max_positions - 1)
    assert torch.equal(cope_positions(causal, max_positions)[0, 0], counted.to(dtype))
    rest = (n - j).clamp(max=max_positions - 1).expand(n, n)
    assert torch.equal(cope_positions(huge, max_positions)[0, 0], rest.to(dtype))

    # A one-hot query picks channel c of each row, so the logit must be that entry bit for bit.
    cope = module(max_positions).to(dtype)
    q = torch.zeros(1, 1, n, 4, dtype=dtype)
    q[..., 2] = 1.0
    table = cope.embedding.detach()[:, 2]
    out = cope(q, causal)[0, 0]
    assert torch.equal(out[j <= i], table[counted[j <= i]])
    assert torch.equal(cope(q, huge)[0, 0], table[rest])


def test_a_linear_table_gives_back_the_position():
    """e[r] = r and q = 1: Eq. 5 is linear between rows, so the logit is p itself."""
    _, logits, mask = case(causal=True, dtype=torch.float32)
    cope = CoPE(1, 8)
    with torch.no_grad():
        cope.embedding.copy_(torch.arange(8.0).unsqueeze(-1))
    out = cope(torch.ones(2, 2, 5, 1), logits)
    pos = cope_positions(logits, 8)
    torch.testing.assert_close(out[~mask], pos[~mask], **TOL[torch.float32])


@pytest.mark.parametrize("max_positions", [2, 8])
def test_gradcheck_through_q_logits_and_table(max_positions):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 3, 2, generator=g, dtype=F64, requires_grad=True)
    logits = torch.randn(1, 2, 3, 3, generator=g, dtype=F64, requires_grad=True)
    table = torch.randn(max_positions, 2, generator=g, dtype=F64, requires_grad=True)
    mask = masked(2, 2, 3, 3, causal=True)[:1]  # causal, and head 1's query 0 fully masked
    cope = CoPE(2, max_positions).double()
    # floor and ceil are steps: keep every position (clamped or not) off the integers.
    raw = cope_positions(logits.detach().masked_fill(mask, NEG_INF), 1000)[~mask]
    assert float((raw - raw.round()).abs().min()) > 1e-3

    def f(q, logits, table):
        return torch.func.functional_call(
            cope, {"embedding": table}, (q, logits.masked_fill(mask, NEG_INF))
        )

    assert torch.autograd.gradcheck(f, (q, logits, table))


def test_masked_entries_have_finite_zero_gradients():
    q, logits, mask = case(causal=True, dtype=torch.float32)
    q.requires_grad_(True)
    logits.requires_grad_(True)
    cope = module(4)
    out = cope(q, logits)
    assert bool(torch.isfinite(out).all())  # the fully masked row too
    live = ~mask.all(-1)  # softmax of a fully masked row is NaN whatever CoPE does: left out
    attn = torch.softmax((logits + out)[live], dim=-1)
    (attn * torch.randn_like(attn)).sum().add((out * torch.randn_like(out)).sum()).backward()
    for grad in (q.grad, logits.grad, cope.embedding.grad):
        assert grad is not None and bool(torch.isfinite(grad).all())
    assert bool((logits.grad[mask] == 0).all())


def test_released_code_default_is_q_over_sqrt_d():
    """The authors' training code divides (q.k + q.e) by sqrt(d); here that is logits + CoPE
    applied to q / sqrt(d) (the module's scaling note)."""
    q, logits, _ = case(causal=True)
    cope = module(16).double()
    _, qe = reference(q, logits, cope.embedding.detach())
    assert_close(cope(q / 2.0, logits), qe / 2.0, F64)  # head_dim 4


def test_a_nan_logit_gives_nan_not_an_index_error():
    logits = torch.randn(1, 1, 2, 3)
    logits[0, 0, 0, 1] = float("nan")
    out = module(8)(torch.randn(1, 1, 2, 4), logits)
    assert bool(out[0, 0, 0, :2].isnan().all()) and bool(out[0, 0, 1].isfinite().all())


def test_default_table_is_zero_and_adds_nothing():
    cope = CoPE(8, 16)
    assert cope.embedding.shape == (16, 8) and not bool(cope.embedding.any())
    q, logits = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 3)
    assert not bool(cope(q, logits).any())
    assert isinstance(cope.embedding, torch.nn.Parameter)


@pytest.mark.parametrize(
    "args,name,shown",
    [
        ((8, 1), "max_positions", "got 1"),
        ((8, 0), "max_positions", "got 0"),
        ((8, 2.5), "max_positions", "got 2.5"),
        ((8, True), "max_positions", "got True"),
        ((0, 16), "head_dim", "got 0"),
        ((-4, 16), "head_dim", "got -4"),
        ((8, 16, -0.1), "init_std", "got -0.1"),
        ((8, 16, float("nan")), "init_std", "got nan"),
    ],
)
def test_bad_settings_are_refused_by_name(args, name, shown):
    with pytest.raises(InputError, match=name) as info:
        CoPE(*args)
    assert shown in str(info.value)
    if name == "max_positions":
        assert ">= 2" in str(info.value)


def test_bad_inputs_are_refused_by_name():
    cope = CoPE(4, 8)
    q, logits = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 7)
    bad = [
        ((q[0], logits), "q must have shape"),
        ((torch.randn(2, 3, 5, 6), logits), "head_dim=4"),
        ((q.long(), logits), "q must have a floating dtype"),
        ((q, logits[:1]), r"attn_logits must have shape .* \(2, 3, 5, k_len\)"),
        ((q, logits[:, :2]), r"got shape \(2, 2, 5, 7\)"),
        ((q, logits[:, :, :4]), "attn_logits"),
        ((q, logits[0]), "attn_logits"),
        ((q, logits.long()), "attn_logits must have a floating dtype"),
    ]
    for call, message in bad:
        with pytest.raises(InputError, match=message):
            cope(*call)
    with pytest.raises(InputError, match=r"max_positions .* got 1"):
        cope_positions(logits, 1)
    with pytest.raises(InputError, match=r"attn_logits must have shape \(\.\.\., q_len"):
        cope_positions(torch.randn(5), 8)


def test_repr_pickle_and_deepcopy():
    cope = module(16)
    assert "head_dim=4, max_positions=16, init_std=1" in repr(cope)
    q, logits, _ = case(causal=True, dtype=torch.float32)
    want = cope(q, logits)
    for clone in (pickle.loads(pickle.dumps(cope)), copy.deepcopy(cope)):
        assert clone is not cope and repr(clone) == repr(cope)
        assert torch.equal(clone(q, logits), want)
