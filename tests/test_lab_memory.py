"""The lab's evaluation chunks: attention-sized tensors stay under the allocator's mmap
threshold on the CPU, and the chunk changes no answer."""

import pytest
import torch

from posemb.lab import flipflop, memory, retrieval
from posemb.lab.config import LabConfig
from posemb.lab.sweep import retrieval_model


@pytest.mark.parametrize(
    ("length", "heads", "most", "want"),
    [
        (64, 4, 32, 32),
        (256, 4, 32, 16),
        (512, 4, 32, 4),
        (1024, 4, 32, 1),
        (4096, 4, 32, 1),
        (1024, 1, 32, 4),
        (128, 4, 3, 3),
    ],
)
def test_windows_per_pass_keeps_a_float32_pair_tensor_within_the_bound(length, heads, most, want):
    got = memory.windows_per_pass(length, heads, most)
    assert got == want
    assert got == 1 or 4 * got * heads * length * length <= memory.PAIR_BYTES
    # Off the CPU the caching allocator reuses memory: the caller's chunk stands.
    assert memory.windows_per_pass(length, heads, most, "cuda") == most


@pytest.mark.parametrize("bad", [{"length": 0}, {"heads": 0}, {"most": 0}])
def test_windows_per_pass_refuses_sizes_below_one(bad):
    args = {"length": 64, "heads": 4, "most": 8} | bad
    with pytest.raises(ValueError, match=f"{next(iter(bad))} must be >= 1"):
        memory.windows_per_pass(**args)


def test_a_chunked_evaluation_runs_small_chunks_and_gives_the_answers_of_one_pass():
    torch.manual_seed(0)
    model = retrieval_model(LabConfig(eval_lens=(64, 512)), "cope", "flipflop")
    gen = torch.Generator().manual_seed(1)
    d = 2 * torch.randint(1, 256, (12,), generator=gen)
    x, a = flipflop.probes(d, 512, gen)
    model.eval()
    with torch.no_grad():
        whole = model(x)[:, -1].argmax(-1)
    sizes = []
    hook = model.register_forward_pre_hook(lambda _, args: sizes.append(len(args[0])))
    try:
        assert retrieval.correct(model, x, a) == int((whole == a).sum())
    finally:
        hook.remove()
    assert sizes == [4, 4, 4]  # 4 heads at 512 tokens: 4 windows a pass
    assert memory.model_heads(model) == 4 and memory.model_heads(torch.nn.Identity()) == 1
