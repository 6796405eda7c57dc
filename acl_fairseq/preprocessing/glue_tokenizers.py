"""The tokenizer of an ``acl-preprocess`` run: its files copied into the output, its record for stats.json, and
the dict.txt the inputs are binarized with (gpt2: the official one; sentencepiece/wordpiece: the tokenizer's
vocabulary or, with ``--dict-from train``, none, so fairseq builds it from the training tokens)."""
import logging
import os
import shutil
from typing import Dict, List, Optional

from acl_runtime.glue_tasks import Example, GlueDataError

logger = logging.getLogger(__name__)


def setup_tokenizer(args, tmp: str, work: str, train_examples: List[Example]):
    """Returns ``(EncoderSpec, srcdict or None, info)``; None means fairseq builds the dict from the training tokens.

    The tokenizer's files are copied into the output, and ``info["tokenizer"]`` is their record
    (:mod:`acl_runtime.tokenization`), names relative to the output, so the folder alone can tokenize."""
    from acl_fairseq.preprocessing import text_encoders as te

    make = {"gpt2": _gpt2, "sentencepiece": _sentencepiece, "wordpiece": _wordpiece}[args.tokenizer]
    info: Dict = {}
    record, srcdict = make(args, tmp, work, train_examples, info)
    info = {"tokenizer": record, **info}
    if srcdict:
        te.check_srcdict(srcdict)
    # only names, never absolute paths: the folder must still describe itself after it is moved
    info["dictionary"] = f"--srcdict {os.path.basename(args.srcdict)}" if args.srcdict else (
        "built from the training tokens" if srcdict is None else f"from the {args.tokenizer} vocabulary")
    return te.EncoderSpec(record, tmp), srcdict, info


def _gpt2(args, tmp, work, train_examples, info):
    from acl_fairseq.preprocessing.gpt2_files import ensure_gpt2_bpe
    from acl_runtime.tokenization import make_record

    paths = ensure_gpt2_bpe(args.bpe_dir, args.bpe_url)
    for name in ("encoder.json", "vocab.bpe"):
        shutil.copyfile(paths[name], os.path.join(tmp, name))
    info["bpe_dir"] = os.path.basename(os.path.normpath(args.bpe_dir))
    # never a dict built from the data: RoBERTa's embeddings are indexed by the official dict.txt
    record = make_record("gpt2", {"encoder_json": "encoder.json", "vocab_bpe": "vocab.bpe"})
    return record, args.srcdict or paths["dict.txt"]


def _sentencepiece(args, tmp, work, train_examples, info):
    from acl_fairseq.preprocessing import text_encoders as te
    from acl_runtime.tokenization import make_record

    model = os.path.join(tmp, "spm.model")  # kept in the output, to decode with
    if args.spm_model:
        _require_file(args.spm_model, "--spm-model")
        shutil.copyfile(args.spm_model, model)
        info["spm_model"] = f"spm.model, a copy of --spm-model {os.path.basename(args.spm_model)}"
    else:  # trained on all of train.tsv's text, also under --few-shot (text only, no labels)
        text_file = os.path.join(work, "spm_train.txt")
        with open(text_file, "w", encoding="utf-8") as f:
            f.writelines(t + "\n" for e in train_examples for t in e.texts if t)
        te.train_sentencepiece(text_file, os.path.join(tmp, "spm"), args.spm_vocab_size, args.workers, args.seed)
        info["spm_model"] = f"spm.model, trained on train.tsv text (--spm-vocab-size {args.spm_vocab_size})"
    return (make_record("sentencepiece", {"model": "spm.model"}),
            args.srcdict or _vocab_dict(args, work, te.write_sentencepiece_dict, model))


def _wordpiece(args, tmp, work, train_examples, info):
    from acl_fairseq.preprocessing import text_encoders as te
    from acl_runtime.tokenization import detect_lowercase, load_vocab, make_record

    _require_file(args.vocab, "--vocab")
    lowercase = args.lowercase if args.lowercase is not None else detect_lowercase(args.vocab, load_vocab(args.vocab))
    logger.info(f"wordpiece: lowercase={lowercase}"
                + ("" if args.lowercase is not None else " (detected from the vocab)"))
    shutil.copyfile(args.vocab, os.path.join(tmp, "vocab.txt"))
    info["vocab"] = f"vocab.txt, a copy of --vocab {os.path.basename(args.vocab)}"
    record = make_record("wordpiece", {"vocab": "vocab.txt"}, lowercase)
    return record, args.srcdict or _vocab_dict(args, work, te.write_wordpiece_dict, args.vocab)


def _vocab_dict(args, work: str, writer, source: str) -> Optional[str]:
    if args.dict_from == "train":
        return None
    path = os.path.join(work, "dict.txt")
    writer(source, path)
    return path


def _require_file(path: str, flag: str) -> None:
    if not os.path.isfile(path):
        raise GlueDataError(f"{path}: no such file (given as {flag}). Fix: pass an existing file")
