"""The offline default model: the exported head file reproduces the trained model; the held-out split."""

from __future__ import annotations

import pytest
import torch

from bertknn.default_model import HEAD_FILE, apply_head_file, load_base
from bertknn.train_head import LORA_TARGETS, _export, is_heldout


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


def test_heldout_split_is_deterministic_and_about_a_fifth():
    titles = [f"Subject {i}" for i in range(5000)]
    share = sum(map(is_heldout, titles)) / len(titles)
    assert 0.18 < share < 0.22
    assert is_heldout("Dante Alighieri") == is_heldout("  dante ALIGHIERI ")


def test_shipped_head_is_small():
    if not HEAD_FILE.is_file():
        pytest.skip("the default head has not been trained yet (bertknn train-head)")
    assert HEAD_FILE.stat().st_size < 8 * 2**20
