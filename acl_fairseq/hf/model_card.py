"""The model card (``README.md``) of an exported folder: how the model was trained, its labels and exits,
and each exit's validation metrics, computed here with acl-evaluate's machinery."""
import logging
import os
import shlex
from typing import Dict, List, Optional

logger = logging.getLogger(__name__)

RECORDED_COMMANDS = ("command.sh", "train.sh")  # what run drivers write beside the checkpoints
MODEL_KEYS = ("encoder_layers", "encoder_embed_dim", "encoder_ffn_embed_dim", "encoder_attention_heads",
              "activation_fn", "max_positions", "dropout", "attention_dropout", "pooler_dropout", "exit_layers",
              "exit_pooling")
OPTIMIZER_KEYS = ("adam_betas", "adam_eps", "weight_decay", "clip_norm", "warmup_updates", "total_num_update",
                  "end_learning_rate", "power")


def _flag(key: str, value) -> List[str]:
    """``--key value`` as fairseq's command line spells it; None and False are left out."""
    if value is None or value is False or value == "":
        return []
    name = "--" + key.replace("_", "-")
    if value is True:
        return [name]
    if key == "adam_betas" and isinstance(value, (list, tuple)):
        return [name, f"({', '.join(map(str, value))})"]
    if isinstance(value, (list, tuple)):
        return [name, ",".join(map(str, value))]
    return [name, str(value)]


def _group(cfg: Dict, name: str) -> Dict:
    """One cfg group as a dict (argparse-era groups are Namespaces)."""
    group = cfg.get(name)
    return dict(vars(group)) if hasattr(group, "__dict__") else dict(group or {})


def training_command(cfg: Dict, checkpoint: str) -> Dict[str, str]:
    """``{"command": ..., "source": ...}``: a recorded command beside the checkpoint, else one rebuilt from the
    checkpoint's cfg (fairseq does not store its command line; the settings that define the run are listed)."""
    folder = os.path.dirname(os.path.abspath(checkpoint))
    for name in RECORDED_COMMANDS:
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                return {"command": f.read().strip(), "source": f"recorded in {name} beside the checkpoint"}
    task, model, crit, optim, sched, opt, ds, common = (_group(cfg, g) for g in (
        "task", "model", "criterion", "optimizer", "lr_scheduler", "optimization", "dataset", "common"))
    argv = ["fairseq-train", "DATA_BIN", "--user-dir", "acl_fairseq", "--task", str(task.get("_name"))]
    for key in ("num_classes", "regression_target", "init_token", "separator_token"):
        argv += _flag(key, task.get(key))
    argv += ["--arch", str(model.get("arch", model.get("_name")))]
    argv += [x for key in MODEL_KEYS for x in _flag(key, model.get(key))]
    if model.get("conventions"):
        argv += ["--conventions", "ENCODER/conventions.json"]  # the record is kept in the checkpoint
    argv += ["--criterion", str(crit.get("_name"))]
    argv += [x for key, value in crit.items() if key != "_name" for x in _flag(key, value)]
    argv += ["--optimizer", str(optim.get("_name")), "--lr-scheduler", str(sched.get("_name"))]
    argv += [x for key in OPTIMIZER_KEYS for x in _flag(key, optim.get(key, sched.get(key, opt.get(key))))]
    for key, value in (("lr", opt.get("lr")), ("batch_size", ds.get("batch_size")), ("max_epoch", opt.get("max_epoch")),
                       ("max_update", opt.get("max_update")), ("update_freq", opt.get("update_freq")),
                       ("seed", common.get("seed")), ("fp16", common.get("fp16")), ("bf16", common.get("bf16"))):
        argv += _flag(key, value or None if key in ("max_epoch", "max_update") else value)
    return {"command": shlex.join(argv), "source": "rebuilt from the checkpoint's cfg (fairseq keeps no command "
            "line): the task, model, criterion and optimisation settings; DATA_BIN stands for the data folder"}


def exit_metrics(hub, split: str, batch_size: int = 32) -> Optional[Dict]:
    """``{"split", "examples", "per_exit": [{"layer", "metrics"}]}`` on ``split`` of the hub's data folder, with
    acl-evaluate's engine and scoring; None when the split or its labels are missing."""
    from acl_fairseq.inference import scoring
    from acl_torch import glue_metrics

    task, head = hub.task, hub.head_name
    try:
        task.load_dataset(split)
    except FileNotFoundError as e:
        logger.warning("no per-exit metrics: %s", e)
        return None
    dataset = task.dataset(split)
    batches = scoring.make_batches(dataset, list(range(len(dataset))), batch_size)
    _, logits, targets = scoring.collect_exit_logits(hub.model, batches, head)
    if targets is None:
        return None
    ctx = {"task_name": hub.task_name(), "regression": hub.regression,
           "positive": None if hub.regression else glue_metrics.positive_index(task.label_dictionary)}
    per_exit = [{"layer": layer, "metrics": scoring.score(logits[:, m], targets, ctx)}
                for m, layer in enumerate(hub.exit_layers)]
    return {"split": split, "examples": len(dataset), "task": ctx["task_name"], "per_exit": per_exit}


def render(info: Dict) -> str:
    """README.md text. ``info``: family, hf_class, labels, exit_layers, final_layer, command, metrics, record."""
    labels = info["labels"]
    lines = ["---", "library_name: transformers", "pipeline_tag: text-classification",
             f"tags: [{info['family']}, early-exit, acl_fairseq]", "---", "",
             f"# {info['name']}", "",
             f"A `{info['hf_class']}` exported by `acl-export` from the fairseq checkpoint `{info['checkpoint']}` "
             f"(exit layers {info['exit_layers']}; the last, layer {info['final_layer']}, is the classifier).", "",
             "```python", "from transformers import pipeline", "",
             "classify = pipeline(\"text-classification\", model=\"PATH/TO/THIS/FOLDER\")",
             "classify({\"text\": \"first sentence\", \"text_pair\": \"second sentence\"})  # or a single string",
             "```", "", "## Labels", ""]
    lines += ([f"- {i}: `{n}`" for i, n in enumerate(labels)] if labels else
              ["Regression (one output, no activation); STS-B targets were the score / 5."])
    lines += ["", "## Training", "", f"Command ({info['command']['source']}):", "", "```",
              info["command"]["command"], "```", "", "## Validation metrics per exit", ""]
    metrics = info["metrics"]
    if metrics is None:
        lines += ["Not available: the data folder has no labelled validation split."]
    else:
        names = list(metrics["per_exit"][-1]["metrics"])
        lines += [f"Computed by acl-export on the `{metrics['split']}` split of the data folder ({metrics['examples']} "
                  "examples), with acl-evaluate's engine (each exit on every example).", "",
                  "| exit layer | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        lines += [f"| {e['layer']} | " + " | ".join(f"{e['metrics'][n]:.4f}" for n in names) + " |"
                  for e in metrics["per_exit"]]
    lines += ["", "## Early exit", "",
              "`exit_heads.safetensors` holds the heads of the other exits (`exit{layer}.dense.*`, "
              "`exit{layer}.out_proj.*`); `early_exit.json` says how to run them: each reads "
              "`hidden_states[layer][:, 0]` (`output_hidden_states=True`), then dense, tanh, out_proj; the policy "
              "and its threshold decide where an input leaves. This folder alone is the last exit.", "",
              "## Inputs", "", f"{info['layout']}. Text is stripped of surrounding whitespace before tokenizing "
              "(acl-predict does; the tokenizer here does not). Inputs longer than "
              f"{info['max_positions']} tokens: acl-predict cuts the end and keeps the final separator.", ""]
    return "\n".join(lines)
