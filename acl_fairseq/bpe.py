"""``--bpe acl_wordpiece``: BERT WordPiece for fairseq's hub and ``encoders.build_bpe``, offline.

fairseq's own ``--bpe bert`` needs ``transformers`` (a test-only dependency here), downloads a vocab
unless given an absolute ``--bpe-vocab-file``, and is not the tokenizer the data was binarized with.
This one is :func:`acl_runtime.tokenization.build` (the implementation preprocessing uses), and its vocab
is a name relative to the task's data folder (``data`` defaults to ``${task.data}``; fairseq's hub
``from_pretrained`` sets it to the model folder), so a converted checkpoint's folder can move::

    RobertaModel.from_pretrained(OUT, "model.pt", OUT)   # acl-convert-hf stores cfg.bpe = acl_wordpiece
"""
import os
from dataclasses import dataclass, field

from fairseq.data.encoders import register_bpe
from fairseq.data.encoders.gpt2_bpe_utils import get_encoder
from fairseq.dataclass import FairseqDataclass
from omegaconf import II

from acl_runtime import tokenization

# what a "gpt2" tokenizer record runs (the torch-free runtime holds no fairseq code)
tokenization.TRAINING_STACK["gpt2"] = lambda paths: get_encoder(paths["encoder_json"], paths["vocab_bpe"])


@dataclass
class AclWordpieceConfig(FairseqDataclass):
    wordpiece_vocab: str = field(default="vocab.txt", metadata={
        "help": "BERT vocab.txt; a relative name is looked up in the (first) data folder"})
    wordpiece_cased: bool = field(default=False, metadata={"help": "keep case (default: lowercase and strip accents)"})
    data: str = II("task.data")


@register_bpe("acl_wordpiece", dataclass=AclWordpieceConfig)
class AclWordpieceBPE(object):
    def __init__(self, cfg):
        vocab = str(cfg.wordpiece_vocab)
        if os.path.isabs(vocab):
            base, vocab = os.path.split(vocab)
        else:
            base = str(cfg.data or ".").split(os.pathsep)[0]
        record = tokenization.make_record("wordpiece", {"vocab": vocab}, not cfg.wordpiece_cased)
        self.tokenize = tokenization.build(record, base)

    def encode(self, x: str) -> str:
        return " ".join(self.tokenize(x))

    def decode(self, x: str) -> str:
        return tokenization.detokenize(x.split())

    def is_beginning_of_word(self, x: str) -> bool:
        return not x.startswith(tokenization.WORDPIECE_PREFIX)
