"""`posemb convert` and the checkpoint layout conversion behind it."""

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import posemb
from posemb import cli, hf
from tolerances import TOL

HEADS, KV_HEADS, HEAD_DIM, HIDDEN, SEQ = 4, 2, 16, 64, 11


def meta_checkpoint(path, rotary_dim=None):
    """Two layers of Meta-named weights (interleaved layout) plus tensors to leave alone."""
    g = torch.Generator().manual_seed(0)
    t = {}
    for i in range(2):
        t[f"layers.{i}.attention.wq.weight"] = (
            torch.randn(HEADS * HEAD_DIM, HIDDEN, generator=g) / 8
        )
        t[f"layers.{i}.attention.wk.weight"] = (
            torch.randn(KV_HEADS * HEAD_DIM, HIDDEN, generator=g) / 8
        )
        t[f"layers.{i}.attention.wv.weight"] = (
            torch.randn(KV_HEADS * HEAD_DIM, HIDDEN, generator=g) / 8
        )
        t[f"layers.{i}.attention.wo.weight"] = torch.randn(HIDDEN, HEADS * HEAD_DIM, generator=g)
    t["tok_embeddings.weight"] = torch.randn(50, HIDDEN, generator=g).to(torch.bfloat16)
    t["norm.step"] = torch.arange(7, dtype=torch.int64)
    save_file(t, str(path), metadata={"format": "pt", "origin": "test"})
    return t


def attention_of(t, layer, layout, x, rotary_dim=None):
    def heads(w, n):  # (b, s, n * hd) -> (b, n, s, hd)
        return (x @ w.T).view(1, SEQ, n, HEAD_DIM).transpose(1, 2)

    p = f"layers.{layer}.attention."
    rope = posemb.RotaryEmbedding(HEAD_DIM, rotary_dim=rotary_dim, layout=layout)
    q, k = rope(heads(t[p + "wq.weight"], HEADS), heads(t[p + "wk.weight"], KV_HEADS))
    return posemb.dot_product_attention(q, k, heads(t[p + "wv.weight"], KV_HEADS), causal=True)


def load(path):
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()  # noqa: SIM118


@pytest.mark.parametrize("rotary_dim", [None, 8])
def test_converted_weights_give_the_same_attention(tmp_path, rotary_dim):
    src, dst = tmp_path / "meta.safetensors", tmp_path / "hf.safetensors"
    original = meta_checkpoint(src)
    before = src.read_bytes()
    names = hf.convert_checkpoint(src, dst, "half", HEADS, KV_HEADS, rotary_dim=rotary_dim)
    assert sorted(names) == sorted(n for n in original if ".wq." in n or ".wk." in n)
    assert src.read_bytes() == before  # input untouched
    converted, metadata = load(dst)
    assert metadata == {"format": "pt", "origin": "test"}
    x = torch.randn(1, SEQ, HIDDEN, generator=torch.Generator().manual_seed(1))
    for layer in range(2):
        want = attention_of(original, layer, posemb.Layout.INTERLEAVED, x, rotary_dim)
        got = attention_of(converted, layer, posemb.Layout.HALF, x, rotary_dim)
        torch.testing.assert_close(got, want, **TOL[torch.float32])
        unconverted = attention_of(original, layer, posemb.Layout.HALF, x, rotary_dim)
        assert float((unconverted - want).abs().max()) > 1e-3
    # Everything else is byte-identical.
    for name, tensor in original.items():
        if name not in names:
            assert converted[name].dtype == tensor.dtype
            assert converted[name].view(torch.uint8).equal(tensor.view(torch.uint8)), name
    # And the way back restores the file's tensors exactly.
    back = tmp_path / "back.safetensors"
    hf.convert_checkpoint(dst, back, "interleaved", HEADS, KV_HEADS, rotary_dim=rotary_dim)
    restored, _ = load(back)
    for name, tensor in original.items():
        assert restored[name].view(torch.uint8).equal(tensor.view(torch.uint8)), name


def test_cli_convert_reads_head_counts_from_params_json(tmp_path, capsys):
    src, dst = tmp_path / "in.safetensors", tmp_path / "out" / "out.safetensors"
    meta_checkpoint(src)
    params = tmp_path / "params.json"
    params.write_text(
        json.dumps({"dim": HEADS * HEAD_DIM, "n_heads": HEADS, "n_kv_heads": KV_HEADS})
    )
    code = cli.main(["convert", str(src), str(dst), "--to", "half", "--config", str(params)])
    assert code == 0
    assert (
        "converted 4 q/k tensors to the half layout (4 q heads, 2 kv heads)"
        in capsys.readouterr().out
    )
    expected = hf.convert_qk_layout(load(src)[0], "half", HEADS, KV_HEADS)[0]
    for name, tensor in load(dst)[0].items():
        assert torch.equal(tensor, expected[name])


def cli_error(args, capsys):
    code = cli.main(args)
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    return err


def test_convert_refuses_bad_requests_and_leaves_nothing_behind(tmp_path, capsys):
    src = tmp_path / "in.safetensors"
    meta_checkpoint(src)
    before = sorted(p.name for p in tmp_path.iterdir())
    base = ["convert", str(src)]
    assert "is the input file" in cli_error(
        [*base, str(src), "--to", "half", "--num-heads", "4", "--force"], capsys
    )
    out = tmp_path / "out.safetensors"
    out.write_bytes(b"keep me")
    assert "exists; pass --force" in cli_error(
        [*base, str(out), "--to", "half", "--num-heads", "4"], capsys
    )
    assert out.read_bytes() == b"keep me"
    out.unlink()
    assert "not divisible by its head count 3" in cli_error(
        [*base, str(out), "--to", "half", "--num-heads", "3"], capsys
    )
    assert "no q/k projection tensors found" in cli_error(
        [
            *base,
            str(out),
            "--to",
            "half",
            "--num-heads",
            "4",
            "--q-pattern",
            "nope",
            "--k-pattern",
            "nada",
        ],
        capsys,
    )
    assert "--num-heads is required" in cli_error([*base, str(out), "--to", "half"], capsys)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x00" * 5)
    assert "not a readable safetensors file" in cli_error(
        ["convert", str(garbage), str(out), "--to", "half", "--num-heads", "4"], capsys
    )
    assert "does not exist" in cli_error(
        [
            "convert",
            str(tmp_path / "nope.safetensors"),
            str(out),
            "--to",
            "half",
            "--num-heads",
            "4",
        ],
        capsys,
    )
    garbage.unlink()
    # A folder as the output, and outputs that cannot be written: refused before the input is
    # read (an unwritable folder used to fail with a traceback once everything was converted).
    (tmp_path / "adir").mkdir()
    assert "is a folder" in cli_error(
        [*base, str(tmp_path / "adir"), "--to", "half", "--num-heads", "4", "--force"], capsys
    )
    (tmp_path / "adir").rmdir()
    for bad in ("/proc/posemb-x/out.safetensors", str(src / "child.safetensors")):
        assert "cannot be written" in cli_error(
            [*base, bad, "--to", "half", "--num-heads", "4"], capsys
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no output, no temp files


def test_layout_conversion_checks_head_counts():
    t = {"wq.weight": torch.zeros(8, 4), "wk.weight": torch.zeros(8, 4)}
    with pytest.raises(ValueError, match="num_heads must be a positive integer, got 0"):
        hf.convert_qk_layout(t, "half", 0)
    with pytest.raises(ValueError, match="num_kv_heads must be a positive integer, got -1"):
        hf.convert_qk_layout(t, "half", 2, -1)
    with pytest.raises(ValueError, match="dim 100 is not divisible by n_heads 3"):
        hf.attention_shape({"dim": 100, "n_heads": 3})
    assert hf.attention_shape({"dim": 96, "n_heads": 3}).head_dim == 32


def test_old_and_new_import_paths_name_the_same_objects():
    from posemb.hf import convert

    assert hf.convert_checkpoint is convert.convert_checkpoint
    assert hf.convert_qk_layout is convert.convert_qk_layout
    assert (hf.Q_PATTERN, hf.K_PATTERN) == (convert.Q_PATTERN, convert.K_PATTERN)


# --- GQA head counts and sharded checkpoints (issue 30, item 8) --------------------------------


def test_gqa_without_its_key_head_count_is_refused_not_written_wrong(tmp_path, capsys):
    # k was permuted as 4 heads of 8 channels where q's heads are 16 wide: a checkpoint that
    # loaded and gave layer-0 logits off by 0.57.
    t = {"wq.weight": torch.randn(4 * 16, 8), "wk.weight": torch.randn(1 * 16, 8)}
    with pytest.raises(ValueError, match=r"head dims disagree.*pass --num-kv-heads 1"):
        hf.convert_qk_layout(t, "half", 4)
    hf.convert_qk_layout(t, "half", 4, 1)
    src, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    save_file(t, str(src))
    err = cli_error(["convert", str(src), str(out), "--to", "half", "--num-heads", "4"], capsys)
    assert "head dims disagree" in err and "--num-kv-heads 1" in err
    assert not out.exists()
    with pytest.raises(ValueError, match="head dims disagree"):  # a wrong count given
        hf.convert_qk_layout(t, "half", 4, 2)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """A tiny Llama saved by transformers in 5 KB shards (14: a q_proj or k_proj alone in
    some), and its whole state dict."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    folder = tmp_path_factory.mktemp("llama")
    model.save_pretrained(folder, max_shard_size="5KB", safe_serialization=True)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    whole = {}
    for shard in sorted(set(index["weight_map"].values())):
        whole |= load(folder / shard)[0]
    return folder, index["weight_map"], whole


def test_a_sharded_folder_converts_in_one_call_and_back_byte_for_byte(sharded, tmp_path, capsys):
    # Every shard of this checkpoint used to fail (exit 2): embeddings only, the LM head only,
    # or a boundary between q_proj and k_proj.
    folder, wmap, whole = sharded
    by_shard = {}
    for name, shard in wmap.items():
        by_shard.setdefault(shard, set()).add(name.rsplit(".", 2)[-2])
    assert any("q_proj" in s and "k_proj" not in s for s in by_shard.values())
    assert any(not {"q_proj", "k_proj"} & s for s in by_shard.values())
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    out, back = tmp_path / "interleaved", tmp_path / "back"
    args = ["--to", "interleaved", "--num-heads", "4", "--num-kv-heads", "2"]
    assert cli.main(["convert", str(folder), str(out), *args]) == 0
    said = capsys.readouterr().out
    assert "converted 4 q/k tensors to the interleaved layout" in said, said
    assert "in 4 of 14 shards (10 without q/k copied unchanged)" in said, said
    want = hf.convert_qk_layout(whole, "interleaved", 4, 2)[0]
    got = {}
    for shard in set(wmap.values()):
        tensors, metadata = load(out / shard)
        assert metadata == load(folder / shard)[1]
        got |= tensors
    assert got.keys() == want.keys() and all(torch.equal(got[n], want[n]) for n in want)
    assert (out / "model.safetensors.index.json").read_bytes() == before[
        "model.safetensors.index.json"
    ]
    index = out / "model.safetensors.index.json"
    args[1] = "half"
    assert cli.main(["convert", str(index), str(back), *args]) == 0
    for shard in set(wmap.values()):
        assert (back / shard).read_bytes() == before[shard], shard
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # input untouched
    # A second run into the same folder replaces only its own files.
    assert cli.main(["convert", str(folder), str(out), "--to", "interleaved", "--num-heads", "4",
                     "--num-kv-heads", "2"]) == 0  # fmt: skip


def test_each_shard_converts_on_its_own_checked_against_the_whole(sharded, tmp_path, capsys):
    folder, wmap, whole = sharded
    want = hf.convert_qk_layout(whole, "interleaved", 4, 2)[0]
    for shard in sorted(set(wmap.values())):
        dst = tmp_path / shard
        names = hf.convert_checkpoint(folder / shard, dst, "interleaved", 4, 2)
        tensors, _ = load(dst)
        assert all(torch.equal(t, want[n]) for n, t in tensors.items())
        if not names:
            assert dst.read_bytes() != b"" and all(
                torch.equal(t, whole[n]) for n, t in tensors.items()
            )
    # The GQA check reads every shard's header: a shard holding only q still knows k's rows.
    q_only = next(
        s for s in set(wmap.values()) if any("q_proj" in n for n, f in wmap.items() if f == s)
    )
    with pytest.raises(ValueError, match=r"head dims disagree.*--num-kv-heads 2"):
        hf.convert_checkpoint(folder / q_only, tmp_path / "x.safetensors", "interleaved", 4)
    assert not (tmp_path / "x.safetensors").exists()


def test_sharded_conversion_refuses_bad_indexes_and_outputs(sharded, tmp_path, capsys):
    folder, _, _ = sharded
    base = ["--to", "half", "--num-heads", "4", "--num-kv-heads", "2"]
    assert "is the input's folder" in cli_error(
        ["convert", str(folder), str(folder), *base], capsys
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "has no *.safetensors.index.json" in cli_error(
        ["convert", str(empty), str(tmp_path / "o1"), *base], capsys
    )
    bad = tmp_path / "bad"
    bad.mkdir()
    for escape, match in (
        ("../x.safetensors", "must be file names"),
        ("gone.safetensors", "not there"),
    ):
        (bad / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": escape}}))
        assert match in cli_error(["convert", str(bad), str(tmp_path / "o2"), *base], capsys)
    (bad / "model.safetensors.index.json").write_text("{not json")
    assert "not a readable JSON" in cli_error(
        ["convert", str(bad), str(tmp_path / "o3"), *base], capsys
    )
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    assert "did not write" in cli_error(["convert", str(folder), str(taken), *base], capsys)
    assert [p.name for p in taken.iterdir()] == ["notes.txt"]
    assert not any((tmp_path / n).exists() for n in ("o1", "o2", "o3"))


def test_sharded_conversion_checks_everything_before_the_first_shard(sharded, tmp_path, capsys):
    # A rotary_dim wider than the heads was refused after shard 1 was written; an index naming a
    # tensor its shard lacks was converted and copied without a word; a shard converted onto
    # another shard of its checkpoint replaced it.
    folder, wmap, _ = sharded
    base = ["--num-heads", "4", "--num-kv-heads", "2", "--to", "half"]
    for rotary in ("64", "3"):
        out = tmp_path / f"r{rotary}"
        err = cli_error(["convert", str(folder), str(out), *base, "--rotary-dim", rotary], capsys)
        assert "rotary_dim must be" in err and not out.exists()
    broken = tmp_path / "broken"
    broken.mkdir()
    for p in folder.iterdir():
        (broken / p.name).write_bytes(p.read_bytes())
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.ghost.weight"] = sorted(set(wmap.values()))[0]
    (broken / "model.safetensors.index.json").write_text(json.dumps(index))
    err = cli_error(["convert", str(broken), str(tmp_path / "o"), *base], capsys)
    assert "does not hold it" in err and not (tmp_path / "o").exists()
    one, two = sorted(set(wmap.values()))[:2]
    before = (folder / two).read_bytes()
    err = cli_error(["convert", str(folder / one), str(folder / two), *base, "--force"], capsys)
    assert "is a file of the checkpoint" in err and (folder / two).read_bytes() == before
    lone = tmp_path / "embeddings.safetensors"
    save_file({"embed_tokens.weight": torch.zeros(4, 4)}, str(lone))
    err = cli_error(["convert", str(lone), str(tmp_path / "e.safetensors"), *base], capsys)
    assert "one shard of a checkpoint converts with its index beside it" in err
