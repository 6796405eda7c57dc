"""Import a Hugging Face BERT or RoBERTa encoder into fairseq RoBERTa format, offline.

    acl-convert-hf HF_DIR OUT_DIR [--num-classes N]

writes ``OUT_DIR/model.pt`` (a fairseq checkpoint for ``--restore-file``), ``dict.txt``,
``model_args.txt`` (the fairseq-train architecture flags, one line), ``conventions.json`` (the input
conventions of the encoder family, :mod:`acl_runtime.conventions`: pass ``--conventions OUT_DIR``) and
copies of the tokenizer files. A BERT (type_vocab_size 2) restores only into ``multi_exit_roberta``
(with ``--exit-layers N`` it is a single-exit classifier), which holds its segment embedding; fairseq's
``roberta`` has none and refuses the file rather than drop it. How the embeddings, positions and layers
line up, and what is refused: :mod:`acl_fairseq.hf.mapping` (reading and mapping the HF folder); this module
builds the fairseq model from that, checks it loads, and writes the files.

The pooler. BERT's pooler (dense + tanh) equals the dense layer of fairseq's classification head
(dropout, dense, ``--pooler-activation-fn tanh``, dropout, out_proj). It is always stored beside
the model, under the checkpoint key ``"hf_pooler"`` (fairseq ignores that key). With
``--num-classes N`` it also becomes the dense layer of a head ``--classification-head-name``
(with a fresh out_proj) inside the model: a run with the same name and N keeps it; fairseq deletes
(with a warning) a stored head whose size or name does not match, so the file restores either way.
``multi_exit_roberta`` gives its last exit the plain head name, so that exit gets the pooler.

A sequence classifier (``BertForSequenceClassification``: pooler + ``classifier``; ``RobertaForSequenceClassification``:
``classifier.dense`` + ``classifier.out_proj``; what ``acl-export`` writes) keeps its whole head: without
``--num-classes`` the head gets the classifier's size, and with a matching ``--num-classes`` its out_proj too, so
the converted model computes the classifier's logits. (A RoBERTa's ``classifier.dense`` is its pooler.)
"""
import argparse
import json
import logging
import os
import shutil
import tempfile
import warnings
from typing import Dict, List, Optional, Tuple

from acl_fairseq import checkpoint_safety
from acl_fairseq.hf.mapping import (
    TOKENIZER_FILES,
    UnsupportedCheckpointError,
    classifier_head,
    fairseq_order,
    has_segment,
    head_dropout,
    load_hf_state_dict,
    map_state_dict,
    model_args,
    read_config,
    read_vocab,
    tokenizer_folder,
)
from acl_runtime import console, conventions, tokenization
from acl_runtime.io import atomic

logger = logging.getLogger(__name__)
PROG = "acl-convert-hf"

OPTIONAL_TOKENIZER_FILES = ["tokenizer_config.json", "special_tokens_map.json", "tokenizer.json"]
POOLER_KEY = "hf_pooler"
FRESH_BUFFER = "encoder.sentence_encoder.version"  # a buffer fairseq fills itself
README = "README.txt"
PLUGIN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # what fairseq's user_dir must name
# fairseq's hub resolves the arch before it could import anything: the plugin must be named (or imported)
HUB_USAGE = f'RobertaModel.from_pretrained(OUT_DIR, "model.pt", OUT_DIR, user_dir="{PLUGIN_DIR}")'


def make_conventions(config: dict, hf_dir: str, dict_sha256: str) -> dict:
    """The :mod:`acl_runtime.conventions` record of this encoder."""
    if config["model_type"] == "bert":
        lowercase = True  # transformers' BertTokenizer default
        path = os.path.join(hf_dir, "tokenizer_config.json")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                lowercase = bool(json.load(f).get("do_lower_case", True))
        tokenizer = tokenization.make_record("wordpiece", {"vocab": "vocab.txt"}, lowercase)
    else:
        tokenizer = tokenization.make_record("hf_byte_bpe", {"vocab": "vocab.json", "merges": "merges.txt"})
    return conventions.validate({
        "schema": conventions.SCHEMA, "family": config["model_type"],
        "pair_format": conventions.FAMILY_LAYOUT[config["model_type"]][0],
        "segment_embedding": has_segment(config), "head_dropout": head_dropout(config),
        "tokenizer": tokenizer, "dictionary_sha256": dict_sha256,
    })


def hub_bpe(tokenizer: dict) -> dict:
    """``cfg.bpe`` of the checkpoint: what fairseq's hub (``RobertaModel.from_pretrained(OUT, "model.pt",
    OUT)``) tokenizes with, offline. File names are kept relative to the data folder through the
    unresolved ``${task.data}``, which the hub sets to the folder it loads from, so the folder can move."""
    if tokenizer["kind"] == "wordpiece":  # acl_fairseq.bpe: the same implementation preprocessing uses
        return {"_name": "acl_wordpiece", "wordpiece_vocab": tokenizer["files"]["vocab"],
                "wordpiece_cased": not tokenizer["lowercase"], "data": "${task.data}"}
    return {"_name": "hf_byte_bpe", "bpe_vocab": "${task.data}/" + tokenizer["files"]["vocab"],
            "bpe_merges": "${task.data}/" + tokenizer["files"]["merges"], "bpe_add_prefix_space": False}


def build_checkpoint(config, flags, dict_words, encoder_sd, pooler, num_classes, head_name, seed,
                     record: dict, head: Optional[Dict] = None) -> Dict:
    """A fairseq checkpoint dict of a pretrained encoder (task ``masked_lm``). Parameters the HF checkpoint lacks
    (the LM head, a new out_proj) keep fairseq's own initialisation under ``seed``; ``head`` (a whole
    classification head, dense and out_proj) replaces the pooler there when given. A BERT with a segment embedding
    is built as a single-exit ``multi_exit_roberta`` (the only model that holds it), anything else as ``roberta``."""
    arch = ["--arch", "roberta"]
    if record["segment_embedding"]:
        arch = ["--arch", "multi_exit_roberta", "--exit-layers", str(config["num_hidden_layers"]),
                "--conventions", json.dumps(record)]
    cli = [".", "--task", "masked_lm", "--criterion", "masked_lm", *arch, *flags,
           "--tokens-per-sample", flags[flags.index("--max-positions") + 1]]
    if num_classes is not None and pooler is None:
        raise UnsupportedCheckpointError("--num-classes needs a checkpoint with a pooler (pooler.dense)")
    state = dict(encoder_sd)
    if num_classes is not None:
        state.update({f"classification_heads.{head_name}.{k}": v for k, v in (head or pooler).items()})
    checkpoint = fairseq_checkpoint(cli, dict_words, state, seed, record,
                                    None if num_classes is None else (head_name, num_classes),
                                    fresh=("encoder.lm_head.", "classification_heads.", FRESH_BUFFER))
    checkpoint[POOLER_KEY] = {k: v.float().contiguous() for k, v in pooler.items()} if pooler else None
    checkpoint["hf_config"] = config
    return checkpoint


def _build_model(cli: List[str], dict_words: List[str], seed: int, head: Optional[Tuple[str, int]]):
    """``(args, model)``: fairseq-train's ``cli`` parsed and its model built over ``dict_words`` under ``seed``
    (the generator's state is restored after), with the classification head(s) ``head`` registered."""
    import torch
    from fairseq import options
    from fairseq.data import Dictionary
    from fairseq.models.roberta import RobertaModel

    from acl_fairseq.models.multi_exit_roberta import MultiExitRobertaModel

    args = options.parse_args_and_arch(options.get_training_parser(), input_args=[*cli, "--seed", str(seed)])
    dictionary = Dictionary()
    for w in dict_words + ["<mask>"]:
        dictionary.add_symbol(w)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model_cls = MultiExitRobertaModel if args.arch == "multi_exit_roberta" else RobertaModel
        model = model_cls.build_model(args, argparse.Namespace(source_dictionary=dictionary))
        if head is not None:
            model.register_classification_head(head[0], num_classes=head[1])
    return args, model


def _load_strictly(model, state: Dict, fresh: Tuple[str, ...]) -> None:
    """Load ``state`` into ``model``; only parameters under the prefixes ``fresh`` may be missing from it."""
    import torch

    missing, unexpected = torch.nn.Module.load_state_dict(model, state, strict=False)
    kept = [k for k in missing if k.startswith(fresh)]
    if unexpected or len(kept) != len(missing):
        raise RuntimeError(f"conversion bug: missing {sorted(set(missing) - set(kept))}, unexpected {unexpected}")
    if kept:
        logger.info("kept fairseq's initialisation for %s", ", ".join(k for k in kept if k != FRESH_BUFFER))


def fairseq_checkpoint(cli: List[str], dict_words: List[str], state: Dict, seed: int, record: dict,
                       head: Optional[Tuple[str, int]], fresh: Tuple[str, ...]) -> Dict:
    """The checkpoint dict of the model fairseq-train's ``cli`` (task, criterion, arch and model flags) builds over
    ``dict_words``, with ``state`` loaded into it. The model is built here and loaded strictly, so the file is known
    to restore: a parameter of ``state`` it has no place for, or one it lacks outside the prefixes ``fresh`` (which
    keep fairseq's own initialisation under ``seed``), is a conversion bug. ``head``: ``(name, classes)`` of the
    classification head(s) to register (every exit's, on ``multi_exit_roberta``)."""
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    args, model = _build_model(cli, dict_words, seed, head)
    _load_strictly(model, state, fresh)
    with warnings.catch_warnings():  # hydra's "strict flag is deprecated", raised inside fairseq
        warnings.simplefilter("ignore")
        cfg = OmegaConf.to_container(convert_namespace_to_omegaconf(args), resolve=True, enum_to_str=True)
    # fairseq keeps a legacy (argparse) model's cfg as a Namespace; a dict keeps the file loadable by
    # torch.load(weights_only=True) without any allowlist, and fairseq builds the model from it alike
    cfg["model"] = dict(vars(cfg["model"]))
    cfg["bpe"] = hub_bpe(record["tokenizer"])
    return {
        "args": None,
        "cfg": cfg,
        "model": model.state_dict(),
        "optimizer_history": [{"criterion_name": "MaskedLmLoss", "optimizer_name": "none",
                               "lr_scheduler_state": {"best": None}, "num_updates": 0}],
        "extra_state": {"train_iterator": {"epoch": 1, "iterations_in_epoch": 0}},
        "last_optimizer_state": None,
    }


def _keep_classifier(head: Optional[Dict], pooler: Optional[Dict], num_classes: Optional[int], head_name: str):
    """``(pooler, num_classes, head)``: a sequence classifier's head is kept whole at its own size (the default
    of ``num_classes``); its dense layer is the pooler when the checkpoint has no other (RoBERTa)."""
    if head is None:
        return pooler, num_classes, None
    pooler = pooler or {k: v for k, v in head.items() if k.startswith("dense.")}
    classes = head["out_proj.weight"].size(0)
    num_classes = classes if num_classes is None else num_classes
    if num_classes != classes:
        return pooler, num_classes, None
    logger.info("kept the sequence classifier's head (%d classes) as %s", classes, head_name)
    return pooler, num_classes, head


def convert(hf_dir: str, out_dir: str, num_classes: Optional[int] = None,
            head_name: str = "sentence_classification_head", seed: int = 1) -> Dict[str, object]:
    """Convert ``hf_dir`` into ``out_dir``; returns ``{"model_args": [...], "files": [...]}``."""
    config = read_config(hf_dir)
    model_type = config["model_type"]
    with tempfile.TemporaryDirectory(prefix="acl_convert_hf_") as tmp:
        return _convert(hf_dir, _tokenizer_files(hf_dir, model_type, tmp), out_dir, config, num_classes, head_name,
                        seed)


def _tokenizer_files(hf_dir: str, model_type: str, tmp: str) -> str:
    """The folder holding the vocabulary files :func:`read_vocab` reads: ``hf_dir`` itself, or for a folder saved by
    transformers 5 with its ``tokenizer.json`` alone, ``tmp`` with them written from it (one home:
    :func:`acl_fairseq.hf.mapping.tokenizer_folder`)."""
    if all(os.path.isfile(os.path.join(hf_dir, n)) for n in TOKENIZER_FILES[model_type]) or not os.path.isfile(
            os.path.join(hf_dir, "tokenizer.json")):
        return hf_dir  # read_vocab names what is missing
    return tokenizer_folder(hf_dir, model_type, os.path.join(tmp, "tokenizer"))


def _convert(hf_dir: str, vocab_dir: str, out_dir: str, config: dict, num_classes: Optional[int], head_name: str,
             seed: int) -> Dict[str, object]:
    import torch

    model_type = config["model_type"]
    words, specials = read_vocab(vocab_dir, model_type)
    if model_type == "roberta" and specials["pad_token"] != config.get("pad_token_id", 1):
        raise UnsupportedCheckpointError(
            f"config pad_token_id {config.get('pad_token_id')} differs from the tokenizer's {specials['pad_token']}"
        )
    dict_words, hf_ids = fairseq_order(words, specials)
    hf_sd = load_hf_state_dict(hf_dir, model_type)
    head = classifier_head(hf_sd, model_type)
    encoder_sd, pooler = map_state_dict(hf_sd, config, hf_ids)
    pooler, num_classes, head = _keep_classifier(head, pooler, num_classes, head_name)
    flags = model_args(config)
    os.makedirs(out_dir, exist_ok=True)
    # each file through io.atomic: whole or absent (a previous conversion's kept), none left half-written by a
    # failure or a signal, and what a killed run left removed by the next
    dict_path = os.path.join(out_dir, "dict.txt")
    atomic.write_text(dict_path, "".join(f"{w} 1\n" for w in dict_words))
    record = make_conventions(config, vocab_dir, conventions.dictionary_sha256(dict_path))
    checkpoint = build_checkpoint(config, flags, dict_words, encoder_sd, pooler, num_classes, head_name, seed, record,
                                  head)

    atomic.write_through(os.path.join(out_dir, "model.pt"), lambda tmp: torch.save(checkpoint, tmp))
    atomic.write_text(os.path.join(out_dir, "model_args.txt"), " ".join(flags) + "\n")
    conventions.write(os.path.join(out_dir, conventions.FILE_NAME), record)
    write_readme(out_dir, flags)
    files = ["model.pt", "dict.txt", "model_args.txt", conventions.FILE_NAME, README]
    files += _copy_tokenizer_files(hf_dir, vocab_dir, out_dir, model_type)
    logger.info("wrote %s to %s; architecture flags: %s", ", ".join(files), out_dir, " ".join(flags))
    logger.info("its arch is this plugin's multi_exit_roberta: load it with %s (a process that has not imported "
                "acl_fairseq fails with KeyError 'no_progress_bar')", HUB_USAGE.replace("OUT_DIR", repr(out_dir)))
    return {"model_args": flags, "files": files}


def _copy_tokenizer_files(hf_dir: str, vocab_dir: str, out_dir: str, model_type: str) -> List[str]:
    """Copy the tokenizer's files that ``vocab_dir`` (the vocabulary written from a lone tokenizer.json) or else
    ``hf_dir`` has into ``out_dir``, each atomically; returns their names."""
    files = []
    for name in TOKENIZER_FILES[model_type] + OPTIONAL_TOKENIZER_FILES:
        source = next((p for p in (os.path.join(vocab_dir, name), os.path.join(hf_dir, name)) if os.path.isfile(p)),
                      None)
        if source:
            atomic.write_through(os.path.join(out_dir, name), lambda tmp, source=source: shutil.copyfile(source, tmp))
            files.append(name)
    return files


def write_readme(out_dir: str, flags: List[str]) -> None:
    """OUT_DIR/README.txt: how to load the folder, above all that fairseq needs the plugin for its arch."""
    text = f"""Converted by acl-convert-hf (acl_fairseq) from a Hugging Face checkpoint.

The model's arch is multi_exit_roberta, which only the acl_fairseq plugin registers. fairseq without the
plugin fails to load it with KeyError: "'no_progress_bar'" (it does not know the arch). Load it with
    from fairseq.models.roberta import RobertaModel
    {HUB_USAGE.replace("OUT_DIR", "THIS_FOLDER")}
or `import acl_fairseq` before loading, or with the plugin's own hub:
    from acl_fairseq.models.multi_exit_roberta import MultiExitRobertaModel
    MultiExitRobertaModel.from_pretrained(THIS_FOLDER, "model.pt", THIS_FOLDER)

Fine-tune it: fairseq-train DATA --user-dir {PLUGIN_DIR} --arch multi_exit_roberta {" ".join(flags)}
    --conventions THIS_FOLDER --restore-file THIS_FOLDER/model.pt --reset-optimizer --reset-dataloader
    --reset-meters plus the task flags of its input layout:
    python -m acl_fairseq.runs.model_flags flags --conventions THIS_FOLDER
or recipes/glue/finetune.sh with ROBERTA_PATH=THIS_FOLDER/model.pt. Binarize data with --srcdict
THIS_FOLDER/dict.txt.

Files: model.pt (the fairseq checkpoint), dict.txt, model_args.txt (the architecture flags, one line),
{conventions.FILE_NAME} (pair format, segment embedding, tokenizer), the tokenizer files.
"""
    atomic.write_text(os.path.join(out_dir, README), text)


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Convert a Hugging Face BERT/RoBERTa checkpoint folder into fairseq RoBERTa format "
        "(OUT_DIR/model.pt, dict.txt, model_args.txt, tokenizer files) for fairseq-train --restore-file.",
        epilog="Then: fairseq-train ... --arch multi_exit_roberta $(cat OUT_DIR/model_args.txt) --conventions "
        "OUT_DIR --restore-file OUT_DIR/model.pt --reset-optimizer --reset-dataloader --reset-meters, with data "
        "binarized with --srcdict OUT_DIR/dict.txt and the task flags that "
        "'python -m acl_fairseq.runs.model_flags flags "
        "--conventions OUT_DIR' prints (a BERT has one separator). recipes/glue/finetune.sh does all of this from "
        "ROBERTA_PATH=OUT_DIR/model.pt. fairseq's hub loads OUT_DIR only with the plugin: "
        f"{HUB_USAGE} (OUT_DIR/README.txt says so too).",
    )
    parser.add_argument("hf_dir", metavar="HF_DIR", help="folder with config.json, model.safetensors or "
                        "pytorch_model.bin, and vocab.txt (BERT) or vocab.json + merges.txt (RoBERTa), or the "
                        "tokenizer.json transformers 5 saves alone")
    parser.add_argument("out_dir", metavar="OUT_DIR", help="output folder (created if missing)")
    parser.add_argument("--num-classes", type=int, default=None,
                        help="also store a classification head with this many classes whose dense layer is "
                        "BERT's pooler (kept by fairseq-train only with the same --num-classes and head name); "
                        "default: a sequence classifier's own head with its size (its logits unchanged), else no "
                        "head, the pooler stored under the checkpoint key 'hf_pooler' only")
    parser.add_argument("--classification-head-name", default="sentence_classification_head",
                        help="name of that head (fairseq's --classification-head-name)")
    parser.add_argument("--seed", type=int, default=1,
                        help="seed for the parameters the HF checkpoint lacks (LM head, head out_proj)")
    return parser


def cli_main(argv: Optional[List[str]] = None) -> None:
    args = get_parser().parse_args(argv)
    console.setup_logging()

    if args.num_classes is not None and args.num_classes < 1:
        get_parser().error(f"--num-classes must be at least 1, got {args.num_classes}")

    def main() -> None:
        try:  # before the model is read and mapped, rather than a traceback when the first file is written
            atomic.probe_folder(args.out_dir)
        except OSError as e:
            raise console.UsageError(f"OUT_DIR {args.out_dir}: cannot write there ({e.strerror or e}). Fix: choose a "
                                     "folder you can write to") from None
        try:
            convert(args.hf_dir, args.out_dir, args.num_classes, args.classification_head_name, args.seed)
        # a folder this converter cannot map, or weights that are damaged or refused as unsafe
        except (UnsupportedCheckpointError, checkpoint_safety.CheckpointError) as e:
            raise console.UsageError(str(e)) from None

    console.run(PROG, main)


if __name__ == "__main__":
    cli_main()
