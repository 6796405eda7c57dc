"""The encoder family's input conventions, one small record that travels with a converted checkpoint.

``acl-convert-hf`` writes ``conventions.json`` beside ``model.pt``. ``multi_exit_roberta`` reads it
through ``--conventions PATH`` (the file or its folder) and keeps the record itself, as JSON text, in
its arguments, so every checkpoint of the run carries it and nothing depends on the path any more.
Schema (``SCHEMA``), every field required:

- ``family``: ``"bert"`` or ``"roberta"``, the HF ``model_type`` the weights came from.
- ``pair_format``: ``"single"`` builds ``<s> A </s> B </s>`` (BERT's ``[CLS] A [SEP] B [SEP]``; fairseq's
  ``sentence_prediction`` without ``--separator-token``); ``"double"`` builds ``<s> A </s></s> B </s>``
  (RoBERTa; ``--separator-token 2``). The model sets the task's separator from it (the checkpoint wins
  over a disagreeing flag, with a warning). :func:`input_layout` turns it into an :class:`InputLayout`.
- ``segment_embedding``: ``true`` when the encoder has BERT's token-type embedding. Row 0 is folded into
  the position table by the converter, so the model holds the difference row 1 - row 0 as the
  parameter ``segment_delta`` and adds it to the second segment's tokens: those after the first
  ``</s>``, as the stock task passes no segment ids.
- ``head_dropout``: dropout of the classification head (HF ``classifier_dropout``, else
  ``hidden_dropout_prob``); the default of ``--pooler-dropout``. null: fairseq's default 0.
- ``tokenizer``: a :mod:`acl_runtime.tokenization` record, ``{"kind": "wordpiece", "files": {"vocab":
  "vocab.txt"}, "lowercase": bool}`` or ``{"kind": "hf_byte_bpe", "files": {"vocab": "vocab.json",
  "merges": "merges.txt"}, "lowercase": false}``; file names relative to the record's folder. The form
  written before (``{"kind": ..., "vocab": ..., "merges": ...}``, still inside older checkpoints) is read
  and upgraded.
- ``dictionary_sha256``: :func:`dictionary_sha256` of the ``dict.txt`` the embedding rows follow (a data
  folder binarized with another dictionary is refused before training).

When read from a path the record gains ``dictionary_path``, the dict.txt beside it, to name in errors.

The input layout (the init token, the separators, where the second segment starts) is decided here only,
by :func:`input_layout`: the hub's ``encode``, the fairseq-train task flags of the recipes, benchmarks,
demo and tests (:meth:`InputLayout.fairseq_flags`, or ``python -m acl_fairseq.runs.model_flags flags``) and the
model's check at build time (:func:`apply_to_task`) all come from it. This module is the one place that
spells fairseq's separator flag (a test holds every other tracked file to that). It imports neither torch
nor fairseq, so a runtime without them builds inputs exactly as training did.
"""
import hashlib
import json
import logging
import os
from typing import List, NamedTuple, Optional, Sequence, Tuple

from acl_runtime.io import atomic

SCHEMA = "acl_fairseq.conventions/1"
FILE_NAME = "conventions.json"
PAIR_FORMATS = ("single", "double")
TOKENIZER_KINDS = ("wordpiece", "hf_byte_bpe")  # the kinds acl-convert-hf writes
FIELDS = ("schema", "family", "pair_format", "segment_embedding", "head_dropout", "tokenizer", "dictionary_sha256")
BOS = 0  # fairseq Dictionary's <s>, what --init-token names
EOS = 2  # fairseq Dictionary's </s>, what --separator-token names
INIT_FLAG = "--init-token"
SEPARATOR_FLAG = "--separator-token"  # the one spelling of the flag in the repository
PAIR_LAYOUT = {"single": "<s> A </s> B </s>", "double": "<s> A </s></s> B </s>"}
# family -> (the pair format its Hugging Face tokenizer builds, how it reads): the one pair table, read by
# acl-convert-hf (what an imported encoder was pre-trained with) and acl-export --format hf (what HF would build)
FAMILY_LAYOUT = {
    "bert": ("single", "[CLS] A [SEP], pairs [CLS] A [SEP] B [SEP] with token type 1 on B [SEP]"),
    "roberta": ("double", "<s> A </s>, pairs <s> A </s></s> B </s>"),
}
FAMILIES = tuple(FAMILY_LAYOUT)

logger = logging.getLogger(__name__)


class ConventionsError(ValueError):
    """A conventions record that is missing, malformed or contradicts the data."""


class DictionaryMismatch(ConventionsError):
    """The data folder's dictionary is not the one the model's embedding rows follow."""


def validate(record: dict, where: str = "conventions") -> dict:
    """``record`` if it follows the schema, else a ConventionsError naming the field."""
    if not isinstance(record, dict):
        raise ConventionsError(f"{where}: expected a JSON object, got {type(record).__name__}")
    missing = [f for f in FIELDS if f not in record]
    if missing:
        raise ConventionsError(f"{where}: missing field(s) {missing} (schema {SCHEMA})")
    checks = [
        ("schema", record["schema"] == SCHEMA, f"must be {SCHEMA!r}"),
        ("family", record["family"] in FAMILIES, f"must be one of {FAMILIES}"),
        ("pair_format", record["pair_format"] in PAIR_FORMATS, f"must be one of {PAIR_FORMATS}"),
        ("segment_embedding", isinstance(record["segment_embedding"], bool), "must be true or false"),
        ("head_dropout", record["head_dropout"] is None
         or (isinstance(record["head_dropout"], (int, float)) and 0 <= record["head_dropout"] < 1),
         "must be null or a number in [0, 1)"),
    ]
    for name, ok, rule in checks:
        if not ok:
            raise ConventionsError(f"{where}: {name} {record[name]!r} {rule}")
    return _validate_tokenizer(record, where)


def _validate_tokenizer(record: dict, where: str) -> dict:
    from acl_runtime import tokenization

    tokenizer = tokenization.upgrade_legacy(record["tokenizer"])
    try:
        tokenization.validate(tokenizer, f"{where}: tokenizer")
    except ValueError as e:
        raise ConventionsError(str(e)) from None
    if tokenizer["kind"] not in TOKENIZER_KINDS:
        raise ConventionsError(f"{where}: tokenizer kind {tokenizer['kind']!r} must be one of {TOKENIZER_KINDS}")
    if tokenizer is not record["tokenizer"]:
        record = {**record, "tokenizer": tokenizer}
    return record


def read(path: str) -> dict:
    """The record in ``path`` (a conventions.json, or a folder holding one)."""
    if os.path.isdir(path):
        path = os.path.join(path, FILE_NAME)
    if not os.path.isfile(path):
        raise ConventionsError(f"--conventions: {path} not found (acl-convert-hf writes {FILE_NAME} beside model.pt)")
    with open(path, encoding="utf-8") as f:
        try:
            record = json.load(f)
        except json.JSONDecodeError as e:
            raise ConventionsError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    return validate(record, path)


def write(path: str, record: dict) -> None:
    """Write ``record`` atomically as canonical JSON."""
    validate(record, path)
    atomic.write_text(path, dumps(record) + "\n")


def dumps(record: dict) -> str:
    return json.dumps(record, indent=2, sort_keys=True)


def resolve(value) -> Optional[str]:
    """The ``--conventions`` value as stored in a model's arguments: None, or the record as JSON text.

    Accepts what a user passes (a path) and what a checkpoint holds (the JSON text itself)."""
    if value is None or value == "":
        return None
    if isinstance(value, dict):
        return dumps(validate(dict(value)))
    text = str(value)
    if text.lstrip().startswith("{"):
        return dumps(validate(json.loads(text), "--conventions (from the checkpoint)"))
    record = read(text)
    record.setdefault("dictionary_path", os.path.join(os.path.dirname(os.path.abspath(
        os.path.join(text, FILE_NAME) if os.path.isdir(text) else text)), "dict.txt"))
    return dumps(record)


def from_args(args) -> Optional[dict]:
    """The record a model was built with, or None (a RoBERTa checkpoint: fairseq's behaviour)."""
    value = getattr(args, "conventions", None) if not isinstance(args, dict) else args.get("conventions")
    text = resolve(value)
    return None if text is None else json.loads(text)


class InputLayout(NamedTuple):
    """How an encoder's input is laid out: ``init A </s> [separator] B </s>``, as fairseq's
    ``sentence_prediction`` task builds it (``--init-token``, ``--separator-token``)."""

    init: Optional[int] = BOS  # prepended to the input; None: nothing (a task trained without --init-token)
    separator_token: Optional[int] = EOS  # after A's own </s>, before B; None: BERT's one [SEP]
    eos: int = EOS
    segment_embedding: bool = False  # BERT's token types: the second segment (after A's </s>) is type 1

    @property
    def pair_format(self) -> str:
        return "single" if self.separator_token is None else "double"

    @property
    def separator(self) -> Tuple[int, ...]:
        """The ids between the two segments' words: A's ``</s>``, then the separator token if any."""
        return (self.eos,) if self.separator_token is None else (self.eos, self.separator_token)

    def build(self, a: Sequence[int], b: Optional[Sequence[int]] = None) -> List[int]:
        """The token ids of ``(a)`` or ``(a, b)``, each already encoded, without ``</s>``."""
        ids = ([] if self.init is None else [self.init]) + list(a) + [self.eos]
        if b is not None:
            ids += list(self.separator[1:]) + list(b) + [self.eos]
        return ids

    def fit(self, ids: Sequence[int], max_positions: int) -> Tuple[List[int], bool]:
        """``(ids, truncated)``: ``ids`` cut to ``max_positions``, still ending with ``</s>``."""
        if len(ids) <= max_positions:
            return list(ids), False
        return list(ids[: max_positions - 1]) + [self.eos], True

    def segment_ids(self, ids: Sequence[int]) -> List[int]:
        """BERT's token types of built ids: 1 after the first ``</s>`` (the pure-Python :func:`segment_mask`)."""
        out, seen = [], False
        for i in ids:
            out.append(int(seen))
            seen = seen or i == self.eos
        return out

    def fairseq_flags(self) -> List[str]:
        """The ``sentence_prediction`` task flags of fairseq-train that build inputs this way."""
        flags = [] if self.init is None else [INIT_FLAG, str(self.init)]
        return flags + ([] if self.separator_token is None else [SEPARATOR_FLAG, str(self.separator_token)])


def input_layout(record: Optional[dict] = None) -> InputLayout:
    """The layout a conventions record asks for; None (a RoBERTa checkpoint): fairseq's RoBERTa layout."""
    if record is None:
        return InputLayout()
    if record.get("pair_format") not in PAIR_FORMATS:
        raise ConventionsError(f"conventions: pair_format {record.get('pair_format')!r} must be one of {PAIR_FORMATS}")
    return InputLayout(separator_token=EOS if record["pair_format"] == "double" else None,
                       segment_embedding=bool(record.get("segment_embedding", False)))


def task_layout(task_cfg, record: Optional[dict]) -> InputLayout:
    """The layout a loaded checkpoint's task built: a ``sentence_prediction`` task's own flags (its
    separator already set from the record by :func:`apply_to_task`), else the record's with ``<s>`` first."""
    layout = input_layout(record)
    if task_cfg is None or not hasattr(task_cfg, "separator_token"):
        return layout
    return layout._replace(init=getattr(task_cfg, "init_token", BOS), separator_token=task_cfg.separator_token)


def dictionary_sha256(path: str) -> str:
    """sha256 of a fairseq dict.txt's words, one per line (counts and flags do not change the rows)."""
    with open(path, encoding="utf-8") as f:
        words = [line.split(" ")[0] for line in f.read().splitlines() if line]
    return hashlib.sha256("\n".join(words).encode("utf-8")).hexdigest()


def segment_mask(tokens, eos: int, pad: int):
    """B x T bool: the tokens of the second segment, everything after the first ``</s>`` but padding.

    BERT gives token type 1 to ``B [SEP]`` in ``[CLS] A [SEP] B [SEP]``; a single sentence has no
    second segment (only padding follows its ``</s>``)."""
    is_eos = tokens.eq(eos).int()
    before = is_eos.cumsum(1) - is_eos  # separators strictly before each position
    return before.gt(0) & tokens.ne(pad)


def apply_to_task(record: Optional[dict], task) -> None:
    """Make a ``sentence_prediction`` task build its inputs as the record says, before it loads data.

    The record comes from the model's arguments (the checkpoint), so it wins over the task's
    ``--separator-token`` (with a warning); a data dictionary that differs from the record's is refused."""
    cfg = getattr(task, "cfg", None)
    if record is None or cfg is None or not hasattr(cfg, "separator_token"):
        return
    expected = input_layout(record).separator_token
    if cfg.separator_token != expected:
        logger.warning(
            "the encoder's conventions say pair format %r (%s): %s %s becomes %s",
            record["pair_format"], PAIR_LAYOUT[record["pair_format"]], SEPARATOR_FLAG, cfg.separator_token, expected,
        )
        cfg.separator_token = expected
    if record.get("dictionary_sha256") is None:  # validate() requires it: only a hand-made record lacks it
        return
    source = record.get("dictionary_path") or "the converted encoder's dict.txt"
    check_data_dictionary(record["dictionary_sha256"], getattr(cfg, "data", None),
                          f"differs from the encoder's {source}",
                          "the data was binarized with another tokenizer or vocabulary; binarize it again with "
                          "--srcdict set to the encoder's dict.txt")


def data_dictionary_path(data) -> Optional[str]:
    """``DATA/input0/dict.txt`` of a ``--data`` value (the first folder of a ``:``-separated list)."""
    return os.path.join(str(data).split(os.pathsep)[0], "input0", "dict.txt") if data else None


def check_data_dictionary(expected_sha256: str, data, differs: str, why_and_fix: str) -> None:
    """The one data-dictionary check: a :class:`DictionaryMismatch` when the ``dict.txt`` of the data folder ``data``
    does not hash (:func:`dictionary_sha256`) to ``expected_sha256``, the dictionary the embedding rows follow
    (a checkpoint's training record, a converted encoder's record, the dict.txt beside a --restore-file).
    fairseq reads a binarized folder with any dictionary of the right size, so nothing else would notice: every
    token would read another word's embedding. The message is "the data dictionary PATH ``differs``:
    ``why_and_fix``". Data that is not a binarized folder is left to the loader, which says so."""
    path = data_dictionary_path(data)
    if path and os.path.isfile(path) and dictionary_sha256(path) != expected_sha256:
        raise DictionaryMismatch(f"the data dictionary {path} {differs}: {why_and_fix}")
