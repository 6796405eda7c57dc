"""``--task sentence_prediction_acl``: fairseq's ``sentence_prediction`` plus TensorBoard projector
snapshots of the label-embedding geometry that ACL shapes.

A drop-in replacement: data loading, model building, training and validation steps are the stock task's,
with these additions. Before training (not when a checkpoint is loaded for use), the checkpoint training
starts from is checked: a ``--restore-file`` that does not exist is refused (fairseq would train from
random weights and exit 0), and so is one, or a resumed ``checkpoint_last.pt``, trained with another
data dictionary; the model's arguments record the data dictionary's hash, so every checkpoint of the run
carries it (:mod:`acl_fairseq.checkpoint_safety`). Validation (every split but ``--train-subset``) keeps
every example, whatever ``--required-batch-size-multiple``. ``train_step`` tells the criterion when
fairseq replays a dummy batch (``--contrast-across-workers`` needs that). And :meth:`begin_valid_epoch`,
which fairseq calls at the start of every validation, writes the projector snapshots. With
``--projector-every N`` (N > 0), every N-th validation first runs the model in eval mode on a fixed,
seeded sample of ``--projector-samples`` sentences of the validation subset and writes, per exit, their
head representations u^m and the exit's label embeddings (rows of ``out_proj.weight``) as one
embedding-projector snapshot ``exit{L}`` at step = num_updates (see :mod:`acl_fairseq.projector` for the
layout and metadata). Criteria do no file I/O, so this lives in the task.
``--autocast-bf16`` runs forward passes in bf16 autocast (refused on a CPU that would emulate bf16) and
``--compile`` compiles the model for training (:mod:`acl_torch.acceleration`).
An empty or cut-short restore file (or resumed ``checkpoint_last.pt``) stops the run with one line
and exit status 2 (:func:`check_restore_readable`).

    fairseq-train DATA --user-dir acl_fairseq --task sentence_prediction_acl ... \\
        --tensorboard-logdir tb --projector-every 5 --projector-samples 256

then ``tensorboard --logdir tb`` and open the PROJECTOR tab (run ``projector``), colour by ``gold``.

Cost: per snapshot one extra eval forward of the sample (256 sentences by default, in batches of
32, on the training device), i.e. a fraction ``samples / |valid|`` of a validation pass, plus
``M * (samples + K) * d`` numbers written as text (~1.7 MB per exit at d = 768, ~10 MB per snapshot of
a 6-exit base model). Nothing at all when ``--projector-every 0`` (the default).
Only the master process writes under distributed training. The validation count restarts at 0 when a
run resumes.
"""
import argparse
import glob
import logging
import os
from dataclasses import dataclass, field
from typing import List, Optional

from fairseq.tasks import register_task
from fairseq.tasks.sentence_prediction import SentencePredictionConfig, SentencePredictionTask
from omegaconf import II

from acl_runtime import conventions
from acl_torch import acceleration, glue_metrics

from .. import checkpoint_safety, projector

logger = logging.getLogger(__name__)
DEFAULT_RESTORE_FILE = "checkpoint_last.pt"  # fairseq's default, looked up in --save-dir


@dataclass
class SentencePredictionAclConfig(SentencePredictionConfig):
    projector_every: int = field(
        default=0,
        metadata={
            "help": "every N validations, write a TensorBoard embedding-projector snapshot (one tag "
            "exit{L} per exit, step = num_updates) of a fixed validation sample's head "
            "representations u plus that exit's label embeddings, with gold/predicted label, exit "
            "layer and sample/label-embedding marker as metadata; costs one eval forward of the "
            "sample per snapshot and ~(samples+K)*d numbers of text per exit (~1.7 MB at d=768); "
            "needs --tensorboard-logdir or --projector-logdir; 0 = off"
        },
    )
    projector_samples: int = field(
        default=256,
        metadata={"help": "validation sentences in each projector snapshot (fixed over the run)"},
    )
    projector_seed: int = field(
        default=0,
        metadata={
            "help": "seed of the projector's sample choice (independent of --seed, so runs with "
            "different training seeds show the same sentences)"
        },
    )
    projector_subset: str = field(
        default="valid",
        metadata={"help": "data split the projector samples from"},
    )
    projector_logdir: Optional[str] = field(
        default=None,
        metadata={"help": "where projector snapshots go; default: <--tensorboard-logdir>/projector"},
    )
    autocast_bf16: bool = field(
        default=False,
        metadata={
            "help": "run training and validation forward passes under torch.autocast(bfloat16) on the training "
            "device; weights, gradients and the optimizer stay fp32, no loss scale, ACL-Grad's gate in fp32. "
            "Refused (one line naming the CPU kind) on a CPU without amx_bf16 or avx512_bf16, where torch "
            "emulates bf16 ~40x slower than fp32. See docs/mixed_precision.md for measured speed and accuracy"
        },
    )
    compile: bool = field(
        default=False,
        metadata={
            "help": "torch.compile the encoder (with multi_exit_roberta, the whole model with its exit heads) "
            "for training; checkpoints are unchanged. Probed at start-up: where it cannot compile it says so "
            "in one line and trains eagerly. The first steps pay the compile time (~30-40 s on MiniLM), and it may "
            "never pay: on an AMD EPYC (AVX-512 + avx512_bf16, no AMX, 1 thread) a MiniLM 16x128 step took 3.38 s "
            "compiled vs 3.14 s eager in fp32, and 2.54 s vs 1.39 s with --autocast-bf16 (docs/benchmarks.md)"
        },
    )
    compile_backend: str = field(
        default="inductor",
        metadata={"help": "torch.compile backend of --compile: inductor (generated C++/Triton code), or "
                  "aot_eager (traces only: for checking, no speed-up)"},
    )
    # not options of their own: fairseq fills them from --tensorboard-logdir and --train-subset
    tensorboard_logdir: Optional[str] = II("common.tensorboard_logdir")
    train_subset: str = II("dataset.train_subset")
    restore_file: str = II("checkpoint.restore_file")
    checkpoint_suffix: str = II("checkpoint.checkpoint_suffix")
    save_dir: str = II("checkpoint.save_dir")
    cpu: bool = II("common.cpu")


class RefuseEmulatedBf16(argparse.Action):
    """``--autocast-bf16`` as fairseq-train parses it. Without CUDA the model trains on this CPU, so a CPU without bf16
    units is refused here, as argparse refuses a bad value: one line (``PROG: error: ...``) and exit status 2, before
    fairseq sets anything up or logs its configuration. With CUDA the device is known only later: the task's
    ``__init__`` refuses there (``--cpu`` on a GPU host, a GPU before Ampere)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=False, help=kwargs.get("help"))

    def __call__(self, parser, namespace, values, option_string=None):
        import torch

        problem = None if torch.cuda.is_available() else acceleration.bf16_problem("cpu")
        if problem:
            parser.exit(2, f"{parser.prog}: error: {option_string}: {problem}\n")
        setattr(namespace, self.dest, True)


@register_task("sentence_prediction_acl", dataclass=SentencePredictionAclConfig)
class SentencePredictionAclTask(SentencePredictionTask):
    """``sentence_prediction`` plus projector snapshots, every validation example, marked replays."""

    marks_replayed_batches = True  # criteria may rely on :meth:`train_step` telling them
    validates_every_example = True  # see :meth:`get_batch_iterator`

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)  # the config's flags
        # --autocast-bf16 again, refused while argparse parses it (a group that may replace the config's flag)
        help_text = SentencePredictionAclConfig.__dataclass_fields__["autocast_bf16"].metadata["help"]
        parser.add_argument_group(conflict_handler="resolve").add_argument(
            "--autocast-bf16", action=RefuseEmulatedBf16, help=help_text)

    def __init__(self, cfg: SentencePredictionAclConfig, data_dictionary, label_dictionary):
        super().__init__(cfg, data_dictionary, label_dictionary)
        self.num_validations = 0
        self.num_updates: Optional[int] = None  # the trainer's count after the latest train_step
        self._grad_cos: List[float] = []  # per update, while a criterion measures or gates (grad_cos)
        self._grad_cos_epoch: Optional[int] = None
        self._grad_cos_writer = None
        self._indices: Optional[List[int]] = None
        self._writer = None
        self.projector_logdir = None
        if cfg.projector_every < 0:
            raise ValueError(f"--projector-every must be >= 0 (0 = off), got {cfg.projector_every}")
        if cfg.projector_every > 0:
            if cfg.projector_samples <= 0:
                raise ValueError(f"--projector-samples must be positive, got {cfg.projector_samples}")
            self.projector_logdir = projector.resolve_logdir(cfg.projector_logdir, cfg.tensorboard_logdir)
        self.compiled: Optional[acceleration.CompileStats] = None
        self._graphs_logged = 0
        if cfg.autocast_bf16:  # refused at start-up, in one line and exit 2, where bf16 would be emulated (without
            # CUDA fairseq-train's parser refused it already: RefuseEmulatedBf16)
            try:
                logger.info("--autocast-bf16: %s", acceleration.check_bf16(self.device_type))
            except ValueError as e:
                logger.error("%s", e)
                raise SystemExit(2) from None

    @property
    def device_type(self) -> str:
        """Where fairseq-train puts the model: "cpu" with --cpu or without CUDA, else "cuda"."""
        import torch

        try:
            cpu = bool(self.cfg.cpu)
        except Exception:  # a config detached from fairseq's (omegaconf cannot resolve common.cpu)
            cpu = True
        return "cpu" if cpu or not torch.cuda.is_available() else "cuda"

    @classmethod
    def setup_task(cls, cfg, from_checkpoint=False, **kwargs):
        if not from_checkpoint:  # a loaded checkpoint's --restore-file is its history, not a file to read now
            check_restore(cfg)
        return super().setup_task(cfg, from_checkpoint=from_checkpoint, **kwargs)

    def build_model(self, cfg, from_checkpoint=False):
        if not from_checkpoint:  # training: the checkpoints of this run name their data dictionary
            checkpoint_safety.record_dictionary(cfg, self.cfg.data)
        model = super().build_model(cfg, from_checkpoint)
        if self.cfg.compile and not from_checkpoint:  # a model loaded for use runs as it always did
            self.compiled = acceleration.compile_model(model, self.cfg.compile_backend)
        return model

    def build_criterion(self, cfg, from_checkpoint=False):
        # fairseq-train builds the criterion just before it loads --restore-file (or resumes); loading a model
        # for evaluation never does, so a damaged checkpoint_last.pt of a past run does not block that
        check_restore_readable(self.cfg)
        return super().build_criterion(cfg, from_checkpoint)

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        """The stock step; while fairseq replays a dummy batch (``ignore_grad``) the criterion knows it. With
        --autocast-bf16 the forward pass runs under bf16 autocast (the backward outside it)."""
        self.num_updates = update_num + 1  # fairseq passes the count before this update
        replaying = getattr(criterion, "replaying", None)
        step = self._precision(criterion)
        if replaying is None:
            out = super().train_step(sample, model, step, optimizer, update_num, ignore_grad)
        else:
            with replaying(ignore_grad):
                out = super().train_step(sample, model, step, optimizer, update_num, ignore_grad)
        self._log_compiles(update_num + 1)
        return out

    def valid_step(self, sample, model, criterion):
        return super().valid_step(sample, model, self._precision(criterion))

    def _precision(self, criterion):
        return acceleration.AutocastCriterion(criterion, self.device_type) if self.cfg.autocast_bf16 else criterion

    def _log_compiles(self, update: int) -> None:
        """One line whenever --compile compiled new graphs (first compiles and recompiles, counted)."""
        stats = self.compiled
        if stats is None or stats.graphs == self._graphs_logged:
            return
        logger.info("--compile: %d graph(s) compiled by update %d (%d in all, %.1f s in the backend)",
                    stats.graphs - self._graphs_logged, update, stats.graphs, stats.seconds)
        self._graphs_logged = stats.graphs

    def get_batch_iterator(self, dataset, *args, **kwargs):
        """The stock iterator, except that splits other than the training one keep every example.

        fairseq drops a last batch whose size is not a multiple of ``--required-batch-size-multiple``
        (default 8), from validation too: a validation metric would skip up to 7 examples.
        """
        if dataset is not self.datasets.get(self.cfg.train_subset):
            kwargs["required_batch_size_multiple"] = 1
        return super().get_batch_iterator(dataset, *args, **kwargs)

    def reduce_metrics(self, logging_outputs, criterion):
        """The stock reduction; a gated or measuring criterion's per-update cosine is also kept for the epoch's
        TensorBoard histogram (``grad_cos_per_update`` under ``<--tensorboard-logdir>/train``)."""
        super().reduce_metrics(logging_outputs, criterion)
        steps = sum(float(log.get("gated_steps", 0)) for log in logging_outputs)
        if steps > 0:  # one update's micro-batches (summed over workers): their mean cosine
            self._grad_cos.append(sum(float(log.get("grad_cos", 0)) for log in logging_outputs) / steps)

    def begin_epoch(self, epoch, model):
        super().begin_epoch(epoch, model)
        self.write_grad_cos_histogram()  # the previous epoch's, when no validation wrote it
        self._grad_cos_epoch = epoch

    def write_grad_cos_histogram(self) -> None:
        """The per-update cosines since the last call as one histogram, at step = their epoch."""
        values, self._grad_cos = self._grad_cos, []
        logdir = self.cfg.tensorboard_logdir
        if not values or not _is_master() or not (isinstance(logdir, str) and logdir and not logdir.startswith("${")):
            return
        if self._grad_cos_writer is None:
            from tensorboardX import SummaryWriter

            # beside fairseq's own writer of that folder: a suffix, or both may open one file name in one second
            self._grad_cos_writer = SummaryWriter(os.path.join(logdir, "train"), filename_suffix=".grad_cos")
        import numpy as np

        self._grad_cos_writer.add_histogram("grad_cos_per_update", np.asarray(values), self._grad_cos_epoch or 0)
        self._grad_cos_writer.flush()

    def begin_valid_epoch(self, epoch, model):
        super().begin_valid_epoch(epoch, model)
        self.write_grad_cos_histogram()
        self.num_validations += 1
        every = self.cfg.projector_every
        if every > 0 and self.num_validations % every == 0 and _is_master():
            step = self.num_updates if self.num_updates is not None else self.num_validations
            self.write_projector_snapshot(model, step)

    def projector_indices(self) -> List[int]:
        """The fixed sample of ``--projector-subset`` indices (chosen once per run)."""
        if self._indices is None:
            subset = self.cfg.projector_subset
            if subset not in self.datasets:
                self.load_dataset(subset)
            self._indices = projector.choose_indices(
                len(self.datasets[subset]), self.cfg.projector_samples, self.cfg.projector_seed
            )
        return self._indices

    def write_projector_snapshot(self, model, step: int) -> None:
        indices = self.projector_indices()
        regression = bool(self.cfg.regression_target)
        names = [] if regression else glue_metrics.label_names(self.label_dictionary)
        snaps = projector.compute_snapshots(
            model, self.datasets[self.cfg.projector_subset], indices, self.cfg.classification_head_name,
            names, regression=regression,
        )
        if self._writer is None:
            from tensorboardX import SummaryWriter

            self._writer = SummaryWriter(self.projector_logdir)
        projector.write_snapshots(self._writer, snaps, step)
        logger.info(
            "projector snapshot at update %d: %d samples + label embeddings, tags %s, in %s",
            step, len(indices), ", ".join(s.tag for s in snaps), self.projector_logdir,
        )


def check_restore(cfg) -> None:
    """Before training: the checkpoint training starts from exists and was trained with the data's dictionary.

    fairseq looks a non-default ``--restore-file`` up as given (relative to the working directory) and, when
    it is missing, trains from random weights and exits 0. Only its default, ``checkpoint_last.pt``, may be
    missing: it is looked up in ``--save-dir`` and absent on a first run (a resume when present)."""
    restore = getattr(cfg, "restore_file", None)
    suffix = getattr(cfg, "checkpoint_suffix", None) or ""
    if not restore:
        return
    if restore == DEFAULT_RESTORE_FILE:
        last = restore_path(cfg)
        if last and os.path.isfile(last):
            trained = checkpoint_safety.dictionary_in_file(last)
            checkpoint_safety.check_dictionary(trained, getattr(cfg, "data", None), last)
        return
    stem = restore[: -len(".pt")] if restore.endswith(".pt") else restore
    # fairseq inserts --checkpoint-suffix, and under sharded training a shard or model-part suffix, before .pt
    candidates = [restore, f"{stem}{suffix}.pt"] + [
        p for part in ("-shard", "-model_part-") for p in glob.glob(glob.escape(stem + suffix + part) + "*.pt")]
    if not any(os.path.exists(p) for p in candidates):
        raise FileNotFoundError(
            f"--restore-file {restore}: no such file (fairseq would train from random weights). Give the checkpoint "
            f"to start from; a relative path is read from the working directory {os.getcwd()} (only the default, "
            f"{DEFAULT_RESTORE_FILE}, is looked up in --save-dir)"
        )
    if not os.path.isfile(restore):
        return
    # roberta.* downloads and acl-convert-hf keep the dict.txt their embedding rows follow beside model.pt
    beside = os.path.join(os.path.dirname(os.path.abspath(restore)), "dict.txt")
    if os.path.isfile(beside):
        conventions.check_data_dictionary(
            conventions.dictionary_sha256(beside), getattr(cfg, "data", None),
            f"differs from {beside}, the dictionary of --restore-file {restore}",
            f"the data was binarized with another tokenizer or vocabulary; binarize it again with --srcdict {beside}")
    trained = checkpoint_safety.dictionary_in_file(restore)
    if trained is not None or not os.path.isfile(beside):  # a pretrained encoder's dict.txt was checked above
        checkpoint_safety.check_dictionary(trained, getattr(cfg, "data", None), f"--restore-file {restore}")


def restore_path(cfg) -> Optional[str]:
    """The checkpoint fairseq-train will load, as ``checkpoint_utils.load_checkpoint`` picks it: the run's own
    ``checkpoint_last.pt`` (resume) for the default --restore-file, else --restore-file."""
    restore = getattr(cfg, "restore_file", None)
    if not restore:
        return None
    if restore == DEFAULT_RESTORE_FILE:
        save_dir = getattr(cfg, "save_dir", None) or "."
        return os.path.join(save_dir, f"checkpoint_last{getattr(cfg, 'checkpoint_suffix', '') or ''}.pt")
    return restore


def check_restore_readable(cfg) -> None:
    """Stop with one line and exit status 2 when the checkpoint fairseq-train is about to load is empty or cut
    short (a killed save, a partial copy), or a pickle torch's safe loader refuses (naming the global it asks
    for); torch would fail with a traceback after the model is built. Read through the package's one safe
    loader, its tensors memory-mapped where the format allows it. A missing file is left to fairseq (a first
    launch has no checkpoint_last.pt)."""
    path = restore_path(cfg)
    if path is None or not os.path.exists(path):
        return
    try:
        if cfg.restore_file == DEFAULT_RESTORE_FILE:  # resuming the run in --save-dir
            checkpoint_safety.load(path, mmap=True, flag="the run's checkpoint_last.pt", fix=(
                "Fix: remove it to start the run over, or copy a whole checkpoint of this run (e.g. "
                "checkpoint_best.pt) over it"))
        else:
            checkpoint_safety.load(path, mmap=True, flag="--restore-file")
    except checkpoint_safety.CheckpointError as e:
        logger.error("%s", e)
        raise SystemExit(2) from None


def _is_master() -> bool:
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


