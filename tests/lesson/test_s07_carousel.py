"""Screen 7: the carousel; the logit's offset, its sign, decay as a bound, scaling."""

import torch

from posemb.rope import RotaryEmbedding


class _PositionBlindRope(RotaryEmbedding):
    def rotate(self, x, positions=None, inplace=False):
        return super().rotate(x, torch.zeros_like(positions))


class _DecayingRope(RotaryEmbedding):
    """A "RoPE" whose output shrinks with position: logits now do decay."""

    def rotate(self, x, positions=None, inplace=False):
        return super().rotate(x, positions) * torch.exp(-positions.to(x.dtype) / 500)[:, None]


def test_the_decay_claim_fails_when_rotation_shrinks_vectors(broken):
    assert not broken("rope.no_decay_for_random_vectors", "RotaryEmbedding", _DecayingRope)


def test_the_sign_claim_fails_without_positions(broken):
    assert not broken("rope.logit_tells_before_from_after", "RotaryEmbedding", _PositionBlindRope)


def test_the_scaling_claim_fails_when_yarn_restores_everything(broken, fake_lab):
    flat = fake_lab(yarn_flat=True)
    assert not broken("rope.scaling_alone_is_partial", "lab_summary", lambda: flat)
