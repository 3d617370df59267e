"""The offline default model: the exported head file reproduces the trained model and resumes its training; the
held-out split."""

from __future__ import annotations

import pytest
import torch

from bertknn.model.default_model import HEAD_FILE, apply_head_file, load_base
from bertknn.model.train_head import LORA_TARGETS, _export, _resume_from, is_heldout


def test_exported_head_reproduces_the_trained_model(tmp_path, tokenizer):
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    trained = peft.get_peft_model(load_base(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS))
    with torch.no_grad():  # stand in for training: move every trained part away from its initial value
        for name, param in trained.named_parameters():
            if "lora_B" in name or ".cls." in f".{name.removeprefix('base_model.model.')}":
                param.add_(torch.randn_like(param) * 0.05)
        trained.base_model.model.bert.embeddings.word_embeddings.weight[tokenizer.mask_token_id] += 0.5
    trained.eval()
    _export(trained, tmp_path / "head.safetensors", tokenizer.mask_token_id, scaling=2.0, info={"steps": 0})
    loaded = load_base()
    assert apply_head_file(loaded, tmp_path / "head.safetensors") == {"steps": 0}
    loaded.eval()
    ids = tokenizer(["Dante was born in [MASK] .", "The [MASK] is red ."], padding=True, return_tensors="pt")
    with torch.no_grad():
        want = trained(**ids).logits
        got = loaded(**ids).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(load_base().eval()(**ids).logits, want, atol=1e-2)

    resumed = peft.get_peft_model(load_base(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS))
    _resume_from(resumed, tmp_path / "head.safetensors", tokenizer.mask_token_id)  # train-head --init
    trainable = [n for n, p in trained.named_parameters() if "lora_" in n or ".cls." in n]
    assert len(trainable) > 6 * 6 * 2  # LoRA A and B of six linear layers in each of six blocks, and the head
    for name, param in resumed.named_parameters():
        if name in trainable or name.endswith("word_embeddings.weight"):
            torch.testing.assert_close(param, trained.get_parameter(name), rtol=0, atol=0)  # a resume: the same bits
    resumed.eval()
    with torch.no_grad():
        torch.testing.assert_close(resumed(**ids).logits, want, rtol=0, atol=0)  # same machine, same calls
    other_rank = peft.get_peft_model(load_base(), peft.LoraConfig(r=8, target_modules=LORA_TARGETS))
    with pytest.raises(ValueError, match="does not fit this model"):
        _resume_from(other_rank, tmp_path / "head.safetensors", tokenizer.mask_token_id)


def test_heldout_split_is_deterministic_and_about_a_fifth():
    titles = [f"Subject {i}" for i in range(5000)]
    share = sum(map(is_heldout, titles)) / len(titles)
    assert 0.18 < share < 0.22
    assert is_heldout("Dante Alighieri") == is_heldout("  dante ALIGHIERI ")


def test_shipped_head_is_small():
    if not HEAD_FILE.is_file():
        pytest.skip("the default head has not been trained yet (bertknn train-head)")
    assert HEAD_FILE.stat().st_size < 8 * 2**20
