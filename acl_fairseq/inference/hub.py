"""Raw text in, predictions out: the hub interface of ``multi_exit_roberta`` (and of plain ``roberta``).

    from acl_fairseq.models.multi_exit_roberta import MultiExitRobertaModel
    m = MultiExitRobertaModel.from_pretrained("runs/RTE/acl_cross_layer/seed1", "checkpoint_best.pt",
                                              "data-bin/RTE-bin")
    m.predict_early_exit([("A man plays.", "Someone plays.")], policy="entropy", threshold=0.3)

Without ``policy`` (and without ``exit_layer``) the last exit decides, unless ``acl-evaluate --calibrate`` wrote an
``exit_policy.json`` for this checkpoint beside it: then its policy and threshold (``m.calibrated``) decide, and
``policy="none"`` asks for the last exit (:mod:`acl_runtime.calibration`).

The tokenizer comes from the data folder's record (``stats.json`` "tokenizer", written by
preprocess/glue.py; or the ``conventions.json`` of a converted encoder's folder), through the same
implementation preprocessing used (:mod:`acl_runtime.tokenization`). Inputs are built as the task built
them in training, by the checkpoint's :class:`acl_runtime.conventions.InputLayout`: the init token, the first
sentence, ``</s>``, the separator of the pair format, the second sentence, ``</s>``. Prediction runs the early-exit
loop of :mod:`acl_runtime.loop` (the ONNX Runtime engine's too) over the torch model
(:class:`acl_fairseq.inference.early_exit.TorchBackend`, ``acl-evaluate``'s engine) on length-sorted batches,
exited rows leaving the batch; results come back in input order.

fairseq's own ``RobertaModel.from_pretrained(DIR, "model.pt", DIR, user_dir="path/to/acl_fairseq")`` loads
these checkpoints (and ``acl-convert-hf`` folders) too, but only with the plugin: ``user_dir=`` or an
``import acl_fairseq`` before the call. Without it fairseq does not know the arch ``multi_exit_roberta`` and
fails with ``KeyError: "'no_progress_bar'"``.
"""
import logging
import os
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from fairseq.models.roberta.hub_interface import RobertaHubInterface

from acl_fairseq import checkpoint_safety
from acl_fairseq.inference import early_exit
from acl_runtime import calibration, conventions, glue_tasks, loop, pairing, tokenization
from acl_runtime.console import UsageError

logger = logging.getLogger(__name__)

DEFAULT_HEAD = "sentence_classification_head"


class TokenizerNotFound(FileNotFoundError):
    """Neither the data folder nor the checkpoint says how to tokenize."""


def load_tokenizer(data_dir: str, record_from_checkpoint: Optional[dict] = None, record_file: Optional[str] = None):
    """``(tokenize, record, base_dir)``: the data folder's tokenizer (or ``record_file``'s: a stats.json or
    conventions.json). The checkpoint's record wins on casing, with a warning; another kind is an error."""
    if record_file and not os.path.exists(record_file):  # not the data folder's fault: name what was given
        raise TokenizerNotFound(f"--tokenizer {record_file}: no such file. Fix: pass the stats.json or "
                                f"{conventions.FILE_NAME} of the folder the data was made from")
    found = _find_record(record_file) if record_file else _find_record(data_dir)
    if found is None:
        raise TokenizerNotFound(
            f"no tokenizer information for {data_dir}: expected {os.path.join(data_dir, 'stats.json')} with a "
            f"'tokenizer' entry (preprocess/glue.py writes it, with the tokenizer files beside it) or "
            f"{os.path.join(data_dir, conventions.FILE_NAME)} (acl-convert-hf). Binarize the data again, or pass "
            "the stats.json / conventions.json of the folder the data was made from (--tokenizer)"
        )
    record, base = found
    theirs = (record_from_checkpoint or {}).get("tokenizer")
    if theirs:
        if theirs["kind"] != record["kind"]:
            raise ValueError(f"the checkpoint was trained with a {theirs['kind']} tokenizer, the data folder "
                             f"{base} records {record['kind']}: use the data folder the model was trained on")
        if record["kind"] == "wordpiece" and bool(theirs.get("lowercase")) != bool(record.get("lowercase")):
            logger.warning("the checkpoint's tokenizer lowercase=%s differs from the data folder's; the "
                           "checkpoint wins", theirs.get("lowercase"))
            record = dict(record, lowercase=theirs.get("lowercase"))
    return tokenization.build(record, base), record, base


def _find_record(path: str) -> Optional[Tuple[dict, str]]:
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    if os.path.isdir(path) or os.path.basename(path) == "stats.json":
        record = tokenization.read(folder)
        if record is not None:
            return record, folder
    conv = os.path.join(folder, conventions.FILE_NAME)
    if os.path.isfile(conv):
        return tokenization.validate(conventions.read(conv)["tokenizer"]), folder
    return None


class MultiExitHubInterface(RobertaHubInterface, loop.EarlyExitPredictor):
    """fairseq's RoBERTa hub interface, with pair building, exit pooling and early exit of this plugin: the
    torch front end of :class:`acl_runtime.loop.EarlyExitPredictor` (``predict_early_exit``,
    ``resolve_request``, ``check_policy``, ``to_predictions``), the ONNX Runtime engine being the other."""

    def __init__(self, cfg, task, model, tokenizer_file: Optional[str] = None):
        super().__init__(cfg, task, model)
        self.conventions = conventions.from_args(cfg.model)
        self.tokenize, self.tokenizer_record, _ = load_tokenizer(cfg.task.data, self.conventions, tokenizer_file)
        # an encoder without a head (a converted model.pt) still encodes and extracts features
        self.exit_layers = early_exit.exit_plan(model, self.head_name)[0] if model.classification_heads else []
        self.regression = bool(getattr(task.cfg, "regression_target", False))
        self.texts_per_input = pairing.from_data(cfg.task.data)  # input1/ in the data folder: pairs
        self.max_positions = int(min(model.max_positions(), getattr(task.cfg, "max_positions", None) or 10 ** 9))
        # a sentence_prediction checkpoint says how it built inputs; a bare encoder (masked_lm) follows fairseq's
        # hub: <s> first, and the separator of its conventions record
        self.layout = conventions.task_layout(task.cfg, self.conventions)
        # the exit_policy.json record calibrated on this checkpoint (from_pretrained finds it), or None
        self.calibrated: Optional[Dict] = None

    @property
    def num_layers(self) -> int:
        """Encoder layers (what a layer speed-up divides); the ONNX runtime's engine has the same attribute."""
        return len(self.model.encoder.sentence_encoder.layers)

    @property
    def serving_policy(self) -> Optional[Dict]:
        """What runs when no policy is given: the calibrated record (``policy``, ``threshold``, ``source``), or
        None for the last exit; the ONNX runtime's engine has the same attribute (from its manifest)."""
        return self.calibrated

    @property
    def head_name(self) -> str:
        name = getattr(self.cfg.criterion, "classification_head_name", None) if self.cfg.get("criterion") else None
        name = name or DEFAULT_HEAD
        if name not in self.model.classification_heads:
            name = next(iter(self.model.classification_heads), DEFAULT_HEAD)
        return name

    # ---- inputs ----------------------------------------------------------------------------------

    def encode(self, a: str, b: Optional[str] = None) -> torch.LongTensor:
        """Token ids of one input as training built it (cut at the model's positions when longer)."""
        return self.encode_with_info(a, b)[0]

    def encode_with_info(self, a: str, b: Optional[str] = None) -> Tuple[torch.LongTensor, bool]:
        """``(tokens, truncated)``: cut at the model's positions, ending with ``</s>``, when too long; each text
        cut first at its byte budget (:func:`acl_runtime.tokenization.clip`), so a huge line costs no more."""
        d = self.task.source_dictionary
        clipped = [tokenization.clip(x, self.max_positions) for x in ((a,) if b is None else (a, b))]
        words = [tokenization.dictionary_ids(d, self.tokenize(text)) for text, _ in clipped]
        ids, truncated = self.layout.fit(self.layout.build(*words), self.max_positions)
        return torch.tensor(ids, dtype=torch.long), truncated or any(cut for _, cut in clipped)

    # ---- prediction ------------------------------------------------------------------------------

    def predict(self, head: str, tokens: torch.LongTensor, return_logits: bool = False):
        """The final exit on ``tokens``, pooled as the model was trained (``--exit-pooling``): log-probs,
        or the logits with ``return_logits`` (fairseq's hub ``predict`` reads ``<s>`` whatever the pooling)."""
        if tokens.dim() == 1:
            tokens = tokens.unsqueeze(0)
        tokens = tokens.to(self.device)
        if hasattr(self.model, "exit_head_names"):
            logits, _ = self.model(tokens, classification_head_name=head)
        else:
            logits = self.model.classification_heads[head](self.extract_features(tokens))
        return logits if return_logits else F.log_softmax(logits, dim=-1)

    # ---- early exit: the loop and the edge of acl_runtime.loop, on the torch backend -------------

    @property
    def backend(self) -> early_exit.TorchBackend:
        return early_exit.TorchBackend(self.model, self.head_name)  # built per call: the model may move devices

    @property
    def pad(self) -> int:
        return self.task.source_dictionary.pad()

    @property
    def regression_scale(self) -> float:
        return glue_tasks.regression_scale(self.task_name()) if self.regression else 1.0  # the task row's

    def make_batches(self, token_lists: Sequence[torch.LongTensor], batch_size: int = 32):
        """``[(positions, src)]``: inputs sorted by (length, position), as acl-evaluate sorts a split,
        cut into batches and right-padded (:func:`acl_runtime.loop.make_batches`, as tensors)."""
        return [loop.Batch(b[0], torch.from_numpy(b[1]), b.lengths)
                for b in loop.make_batches(token_lists, batch_size, self.pad)]

    def run_batches(self, batches, n: int, policy: Optional[str] = None, threshold: Optional[float] = None,
                    exit_layer: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(logits (n, K) of the deciding exit, exit layer (n,))`` in input order, as tensors."""
        logits, layers = super().run_batches(batches, n, policy, threshold, exit_layer)
        return torch.from_numpy(logits), torch.from_numpy(layers)

    def predict_tokens_early_exit(self, token_lists: Sequence[torch.LongTensor], policy: Optional[str] = None,
                                  threshold: Optional[float] = None, exit_layer: Optional[int] = None,
                                  batch_size: int = 32) -> Tuple[torch.Tensor, torch.Tensor]:
        """The lower-level face of :meth:`predict_early_exit`: token tensors in, ``(logits, exit layers)``
        out, in input order (exited rows leave their batch, as in acl-evaluate's engine). No policy: the
        calibrated one when there is one (:func:`acl_runtime.loop.resolve_request`)."""
        request = self.resolve_request(policy, threshold, exit_layer)  # before any batch is built
        logits, layers = self.run_request(self.make_batches(token_lists, batch_size), len(token_lists), request)
        return torch.from_numpy(logits), torch.from_numpy(layers)

    def label_names(self) -> List[str]:
        """Class names in head order (the label dictionary without fairseq's padding entries)."""
        d = self.task.label_dictionary
        n = self.model.classification_heads[self.head_name].out_proj.out_features
        return [d[i + d.nspecial] for i in range(n)]

    def task_name(self) -> Optional[str]:
        """The GLUE task of the data folder (:func:`acl_runtime.glue_tasks.task_of_data`)."""
        return glue_tasks.task_of_data(self.cfg.task.data)


# the files fairseq's hub hands to the model's BPE when they sit beside the checkpoint (as hub_utils does)
BPE_FILES = {"code": "bpe_codes", "bpecodes": "bpe_codes", "sentencepiece.bpe.model": "sentencepiece_model",
             "merges.txt": "bpe_merges", "vocab.json": "bpe_vocab"}


def bpe_files(folder: str) -> Dict[str, str]:
    """The model's BPE arguments for the files of :data:`BPE_FILES` found in ``folder``."""
    return {arg: os.path.join(folder, name) for name, arg in BPE_FILES.items()
            if os.path.exists(os.path.join(folder, name))}


def from_pretrained(model_name_or_path: str, checkpoint_file: str = "checkpoint_best.pt",
                    data_name_or_path: str = ".", tokenizer_file: Optional[str] = None,
                    **kwargs) -> MultiExitHubInterface:
    """Load a checkpoint and wrap it, with the calibrated policy of an ``exit_policy.json`` beside it that was
    written for this file (a :class:`calibration.RecordError` when that file cannot be read).

    The arguments are fairseq's ``hub_utils.from_pretrained``'s, resolved as it resolves them (``data_name_or_path``
    starting with ``.`` is relative to the model folder; ``user_dir=``; the BPE files beside the checkpoint), but
    the file is read by the package's one safe loader (:func:`checkpoint_safety.load_model_and_task`): a damaged
    or unsafe file is one :class:`checkpoint_safety.CheckpointError` naming it (and the global it asks for)."""
    import argparse

    from fairseq import file_utils, utils

    model_path = file_utils.load_archive_file(model_name_or_path)
    kwargs["data"] = (os.path.abspath(os.path.join(model_path, data_name_or_path))
                      if data_name_or_path.startswith(".") else file_utils.load_archive_file(data_name_or_path))
    kwargs.update(bpe_files(model_path))
    if "user_dir" in kwargs:
        utils.import_user_module(argparse.Namespace(user_dir=kwargs["user_dir"]))
    kwargs.setdefault("load_checkpoint_heads", True)
    path = os.path.join(model_path, checkpoint_file)
    models, cfg, task = checkpoint_safety.load_model_and_task(path, kwargs)
    checkpoint_safety.check_loaded_dictionary(models[0], cfg, os.path.join(model_name_or_path, checkpoint_file))
    hub = MultiExitHubInterface(cfg, task, models[0], tokenizer_file)
    hub.calibrated = calibration.for_checkpoint(path)
    return hub


def resolve_device(device: str) -> str:
    """'cpu' or 'cuda' for a --device value (cpu, cuda or auto); asking for CUDA where there is none is a
    :class:`UsageError`."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda, but CUDA is not available here: pass --device cpu or auto")
    return device


def open_checkpoint(path: str, data: str, device: str = "cpu", overrides: Optional[Dict] = None):
    """``(model, cfg, task)``: the checkpoint file ``path`` with the binarized ``data`` folder and its heads, read by
    the package's one safe loader (:func:`checkpoint_safety.load_model_and_task`), in eval mode on ``device`` (cpu,
    cuda or auto): the one opening of a checkpoint file, under acl-evaluate (this bare model) and every hub
    (:func:`from_checkpoint`). Whatever keeps it from opening (no such file, the file damaged or unsafe, another
    task's dictionary, CUDA where there is none) is one :class:`UsageError` naming it and the fix."""
    on_cuda = resolve_device(device) == "cuda"  # before anything loads
    try:
        checkpoint_safety.check_readable(path)  # an empty or cut-short file: one line, before fairseq starts
        models, cfg, task = checkpoint_safety.load_model_and_task(
            path, dict(overrides or {}, data=os.path.abspath(data), load_checkpoint_heads=True))
        checkpoint_safety.check_loaded_dictionary(models[0], cfg, path)
    except (checkpoint_safety.CheckpointError, checkpoint_safety.DictionaryMismatch) as e:
        raise UsageError(str(e)) from None
    model = models[0].eval()
    return (model.cuda() if on_cuda else model), cfg, task


def from_checkpoint(path: str, data: str, tokenizer: Optional[str] = None, device: str = "cpu"
                    ) -> MultiExitHubInterface:
    """The one way the commands and the benchmarks open a checkpoint file as a hub: :func:`open_checkpoint` (with
    the BPE files beside it, as :func:`from_pretrained`), wrapped with the tokenizer of the ``data`` folder (or
    ``tokenizer``, a stats.json or conventions.json, where the data folder's own is not found) and the calibrated
    policy of an exit_policy.json beside it, in eval mode on ``device``. No tokenizer, or an exit_policy.json that
    cannot be read, is a :class:`UsageError` too: every caller's one error policy."""
    on_cuda = resolve_device(device) == "cuda"
    model, cfg, task = open_checkpoint(path, data, "cpu", bpe_files(os.path.dirname(os.path.abspath(path))))
    try:
        hub = MultiExitHubInterface(cfg, task, model, tokenizer)
        hub.calibrated = calibration.for_checkpoint(path)
    except (TokenizerNotFound, calibration.RecordError) as e:
        raise UsageError(str(e)) from None
    hub.eval()
    return hub.cuda() if on_cuda else hub
