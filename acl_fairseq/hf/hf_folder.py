"""``acl-export --format hf``: the Hugging Face folder (``OUT/hf``) of a loaded hub model.

Which HF family: the tokenizer's (:func:`acl_fairseq.hf.export_tokenizer.family_of`): WordPiece -> BERT,
byte-level BPE -> RoBERTa. Their tokenizers build inputs one way each, which must be the way the model was
trained: ``[CLS] A [SEP] B [SEP]`` (BERT, pair format ``single``, token type 1 on ``B [SEP]``) and ``<s> A </s></s>
B </s>`` (RoBERTa, ``double``), both starting with row 0. A model trained otherwise on pairs is refused.
"""
import json
import logging
import os
from typing import Dict, List

from acl_fairseq.hf import export_tokenizer, export_weights, model_card
from acl_fairseq.hf.export_tokenizer import ExportError
from acl_runtime import conventions, exits

logger = logging.getLogger(__name__)
SCHEMA = "acl_fairseq.early_exit/1"
EARLY_EXIT_FILE = "early_exit.json"
EXIT_HEADS_FILE = "exit_heads.safetensors"

LAYOUTS = conventions.FAMILY_LAYOUT  # family -> (pair format its HF tokenizer builds, how it reads)


def input_layout(hub, family: str, has_pairs: bool) -> Dict:
    """The layout record; refuses a model whose training inputs HF's tokenizer of ``family`` would not build."""
    pair_format, text = LAYOUTS[family]
    layout = hub.layout  # conventions.InputLayout, the one home of how training built its inputs
    if layout.init != conventions.BOS:
        raise ExportError(f"the model was trained with init token {layout.init}: HF's tokenizers start every "
                          "input with row 0 (<s> / [CLS])")
    if has_pairs and layout.pair_format != pair_format:
        raise ExportError(f"the model was trained on pairs as {conventions.PAIR_LAYOUT[layout.pair_format]}, but "
                          f"HF's {family} tokenizer builds {conventions.PAIR_LAYOUT[pair_format]}")
    # InputLayout(**{k: record[k] for k in InputLayout._fields}) rebuilds it on the serving side
    return {"family": family, "pair_format": pair_format, "layout": text, **layout._asdict(),
            "separator": list(layout.separator), "strip": True, "max_positions": hub.max_positions}


def early_exit_record(ctx, exit_layers: List[int], labels, layout: Dict) -> Dict:
    args = ctx.args
    threshold = args.threshold  # resolved once, by export.serving_policy
    return {
        "schema": SCHEMA,
        "exit_layers": exit_layers,
        "final_exit_layer": exit_layers[-1],
        "pooling": "cls",
        "heads": {str(layer): f"exit{layer}" for layer in exit_layers[:-1]},
        "heads_file": EXIT_HEADS_FILE,
        "head": "dropout, dense, tanh, dropout, out_proj on hidden_states[layer][:, 0]; the final exit is the "
                "model's own classifier",
        "policy": args.policy,
        "threshold": threshold,
        "calibration": getattr(args, "calibration", None),  # the exit_policy.json record the policy came from
        "policy_rules": {name: p.rule for name, p in exits.POLICIES.items()},  # exits.POLICIES, the one table
        "default_thresholds": {name: p.default for name, p in exits.POLICIES.items()},
        "labels": labels,
        "regression": labels is None,
        "input_layout": layout,
    }


def write(ctx, out_dir: str) -> List[str]:
    """Write the folder; returns the file names."""
    from safetensors.torch import save_file

    from acl_fairseq.inference import hub as hub_mod

    hub, args = ctx.hub, ctx.args
    if not hub.model.classification_heads:
        raise ExportError(f"{args.checkpoint} has no classification head: export a fine-tuned checkpoint")
    _, record, base = hub_mod.load_tokenizer(hub.cfg.task.data, hub.conventions, args.tokenizer)
    family = export_tokenizer.family_of(record)
    has_pairs = os.path.isdir(os.path.join(args.data, "input1"))
    layout = input_layout(hub, family, has_pairs)
    labels = None if hub.regression else hub.label_names()
    layers = list(hub.exit_layers)
    head_names = hub.model.exit_head_names(hub.head_name) if hasattr(hub.model, "exit_head_names") \
        else [hub.head_name]
    files = export_tokenizer.write(record, base, list(hub.task.source_dictionary.symbols), hub.max_positions, out_dir)
    weights, heads = export_weights.state_dict(hub.model, family, head_names, layers)
    head_dropout = float(getattr(hub.model.args, "pooler_dropout", 0.0) or 0.0)
    config = export_weights.config(hub.model, family, layers, labels, head_dropout)
    save_file(weights, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    save_file(heads, os.path.join(out_dir, EXIT_HEADS_FILE), metadata={"format": "pt"})
    _dump(config, os.path.join(out_dir, "config.json"))
    _dump(early_exit_record(ctx, layers, labels, layout), os.path.join(out_dir, EARLY_EXIT_FILE))
    metrics = None
    if args.metrics_split != "none":
        metrics = model_card.exit_metrics(hub, args.metrics_split, args.batch_size)
    card = {"name": os.path.basename(os.path.normpath(os.path.abspath(args.output))), "family": family,
            "hf_class": export_weights.CLASSES[family], "checkpoint": os.path.basename(args.checkpoint),
            "labels": labels, "exit_layers": layers, "final_layer": layers[-1], "layout": layout["layout"],
            "max_positions": hub.max_positions, "command": model_card.training_command(ctx.cfg, args.checkpoint),
            "metrics": metrics}
    with open(os.path.join(out_dir, "README.md"), "w", encoding="utf-8") as f:
        f.write(model_card.render(card))
    return files + ["model.safetensors", "config.json", EXIT_HEADS_FILE, EARLY_EXIT_FILE, "README.md"]


def _dump(obj, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
