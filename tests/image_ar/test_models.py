"""LlamaGen-style model, its cache and CFG wrapper, and the VQ tokenizer."""

import pytest
import torch
from transformers import AutoModel

from mmspec.errors import MMSpecError
from mmspec.image_ar import CFGTarget, LlamaGenConfig, LlamaGenForClassConditional, VQModel, tiny_vq
from mmspec.image_ar.llamagen import rope_table_2d
from mmspec.testing import reload_from_disk


def official_gpt_names(n_layer):
    """Parameter names of LlamaGen's c2i GPT (autoregressive/models/gpt.py)."""
    names = {"tok_embeddings.weight", "cls_embedding.embedding_table.weight", "norm.weight", "output.weight"}
    for i in range(n_layer):
        names |= {
            f"layers.{i}.attention.wqkv.weight",
            f"layers.{i}.attention.wo.weight",
            f"layers.{i}.feed_forward.w1.weight",
            f"layers.{i}.feed_forward.w2.weight",
            f"layers.{i}.feed_forward.w3.weight",
            f"layers.{i}.attention_norm.weight",
            f"layers.{i}.ffn_norm.weight",
        }
    return names


def test_parameter_names_and_shapes_follow_llamagen():
    config = LlamaGenConfig(vocab_size=64, dim=48, n_layer=2, n_head=3, multiple_of=16, num_classes=5, block_size=16)
    model = LlamaGenForClassConditional(config)
    state = model.state_dict()
    assert set(state) == official_gpt_names(2)
    assert state["cls_embedding.embedding_table.weight"].shape == (6, 48)  # + the null class
    assert state["layers.0.attention.wqkv.weight"].shape == (3 * 48, 48)
    assert state["layers.0.feed_forward.w1.weight"].shape == (128, 48)  # find_multiple(int(2 * 4 * 48 / 3), 16)


def test_save_load_roundtrip_and_auto_model(model, tmp_path):
    tokens, labels = torch.randint(0, 12, (2, 7)), torch.tensor([0, 2])
    expected = model(class_labels=labels, input_ids=tokens).logits
    assert torch.equal(reload_from_disk(model)(class_labels=labels, input_ids=tokens).logits, expected)
    model.save_pretrained(tmp_path)
    loaded = AutoModel.from_pretrained(tmp_path)
    assert isinstance(loaded, LlamaGenForClassConditional)
    assert torch.equal(loaded(class_labels=labels, input_ids=tokens).logits, expected)


def test_official_checkpoint_loader(model, tmp_path):
    path = tmp_path / "c2i_tiny.pt"
    torch.save({"model": model.state_dict()}, path)
    loaded = LlamaGenForClassConditional.from_llamagen_checkpoint(str(path), model.config)
    tokens, labels = torch.randint(0, 12, (1, 5)), torch.tensor([1])
    assert torch.equal(loaded(class_labels=labels, input_ids=tokens).logits, model(class_labels=labels, input_ids=tokens).logits)
    wrong = LlamaGenConfig(**{**model.config.to_dict(), "dim": 64})
    with pytest.raises((MMSpecError, RuntimeError)):
        LlamaGenForClassConditional.from_llamagen_checkpoint(str(path), wrong)


def test_rope_2d_layout():
    table = rope_table_2d(grid_size=3, head_dim=8, base=10000.0, cls_token_num=1)
    assert table.shape == (10, 4, 2)
    assert torch.equal(table[0], torch.zeros(4, 2))  # class position: zeros, as in LlamaGen
    cells = table[1:].view(3, 3, 4, 2)
    # pairs 0-1 turn with the row, pairs 2-3 with the column
    assert torch.allclose(cells[1, 0, :2], cells[1, 2, :2]) and not torch.allclose(cells[0, 0, :2], cells[1, 0, :2])
    assert torch.allclose(cells[0, 1, 2:], cells[2, 1, 2:]) and not torch.allclose(cells[0, 0, 2:], cells[0, 1, 2:])


def test_cache_rollback_equals_fresh_prefill(model):
    target = CFGTarget(model, guidance_scale=2.5)
    labels = torch.tensor([1])
    tokens = torch.randint(0, 12, (1, 12), generator=torch.Generator().manual_seed(0))
    full = target.full_logits(labels, tokens)  # [1, 13, V]: row j scores token j
    first = target.start(labels, tokens[:, :6])
    assert torch.allclose(first, full[:, :7], atol=1e-5)
    target.extend(torch.randint(0, 12, (1, 4)))  # a window that gets rejected
    target.truncate(6)
    assert target.length == 6
    again = target.extend(tokens[:, 6:11])
    assert torch.allclose(again, full[:, 7:12], atol=1e-5)
    target.truncate(8)
    assert torch.allclose(target.extend(tokens[:, 8:9]), full[:, 9:10], atol=1e-5)
    with pytest.raises(RuntimeError):
        target.truncate(11)


def test_cfg_rows_in_one_forward(model):
    batches = []
    handle = model.tok_embeddings.register_forward_hook(lambda mod, inp, out: batches.append(out.shape[0]))
    try:
        labels, tokens = torch.tensor([0, 2]), torch.randint(0, 12, (2, 3))
        target = CFGTarget(model, guidance_scale=4.0)
        guided = target.start(labels, tokens)
        assert target.forwards == 1 and batches == [4]
        cond = model(class_labels=labels, input_ids=tokens).logits
        uncond = model(class_labels=torch.full_like(labels, model.config.null_class), input_ids=tokens).logits
        assert torch.allclose(guided, uncond + 4.0 * (cond - uncond), atol=1e-5)
        batches.clear()
        step = target.extend(torch.randint(0, 12, (2, 2)))
        assert batches == [4] and step.shape == (2, 2, 12)
        batches.clear()
        plain = CFGTarget(model, guidance_scale=1.0).start(labels, tokens)
        assert batches == [2] and torch.allclose(plain, cond)
    finally:
        handle.remove()


def test_bad_inputs_raise_clear_errors(model):
    target = CFGTarget(model)
    with pytest.raises(MMSpecError, match="class labels"):
        target.start(torch.tensor([7]))
    with pytest.raises(MMSpecError, match="exceeds"):
        model(class_labels=torch.tensor([0]), input_ids=torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(MMSpecError, match="square"):
        LlamaGenForClassConditional(LlamaGenConfig(vocab_size=8, dim=16, n_layer=1, n_head=2, block_size=10))


def test_vq_shapes_roundtrip_and_codebook():
    vq = tiny_vq(codebook_size=12, embed_dim=4, levels=3)
    images = torch.rand(2, 3, 16, 16) * 2 - 1
    codes = vq.encode(images)
    assert codes.shape == (2, 4, 4) and codes.dtype == torch.long
    assert int(codes.min()) >= 0 and int(codes.max()) < 12
    decoded = vq.decode(codes)
    assert decoded.shape == (2, 3, 16, 16)
    book = vq.codebook_embeddings()
    assert book.shape == (12, 4) and torch.allclose(book.norm(dim=-1), torch.ones(12))  # l2-normalised
    # decoding a code grid equals decoding the looked-up latents
    assert torch.allclose(vq.decode_latents(book[codes].permute(0, 3, 1, 2)), decoded)
    loaded = reload_from_disk(vq)
    assert torch.equal(loaded.encode(images), codes) and torch.allclose(loaded.decode(codes), decoded)
    assert "quantize.embedding.weight" in vq.state_dict() and "encoder.conv_blocks.0.res.0.conv1.weight" in vq.state_dict()


def test_vq_ignores_codebook_usage_buffer(tmp_path):
    vq = tiny_vq()
    vq.save_pretrained(tmp_path)
    from safetensors.torch import load_file, save_file

    file = next(tmp_path.glob("*.safetensors"))
    state = load_file(file)
    state["quantize.codebook_used"] = torch.zeros(65536)
    save_file(state, file, metadata={"format": "pt"})
    loaded = VQModel.from_pretrained(tmp_path)
    assert torch.equal(loaded.quantize.embedding.weight, vq.quantize.embedding.weight)


def test_vq_bad_input():
    vq = tiny_vq()
    with pytest.raises(MMSpecError, match="multiples of 4"):
        vq.encode(torch.zeros(1, 3, 10, 16))
    with pytest.raises(MMSpecError, match="codes must be"):
        vq.decode(torch.full((1, 2, 2), 99))
