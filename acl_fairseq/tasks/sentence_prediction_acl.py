"""``--task sentence_prediction_acl``: fairseq's ``sentence_prediction`` plus TensorBoard projector
snapshots of the label-embedding geometry that ACL shapes.

A drop-in replacement: data loading, batching, model building, training and validation steps are
the stock task's (this class only adds :meth:`begin_valid_epoch`, which fairseq calls at the start of
every validation). With ``--projector-every N`` (N > 0), every N-th validation first runs the model in
eval mode on a fixed, seeded sample of ``--projector-samples`` sentences of the validation subset and
writes, per exit, their head representations u^m and the exit's label embeddings (rows of
``out_proj.weight``) as one embedding-projector snapshot ``exit{L}`` at step = num_updates (see
:mod:`acl_fairseq.projector` for the layout and metadata). Criteria do no file I/O, so this lives
in the task.

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
import logging
from dataclasses import dataclass, field
from typing import List, Optional

from fairseq.logging import metrics
from fairseq.tasks import register_task
from fairseq.tasks.sentence_prediction import SentencePredictionConfig, SentencePredictionTask
from omegaconf import II

from .. import glue_metrics, projector

logger = logging.getLogger(__name__)


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
    # not an option of its own: fairseq fills it from --tensorboard-logdir
    tensorboard_logdir: Optional[str] = II("common.tensorboard_logdir")


@register_task("sentence_prediction_acl", dataclass=SentencePredictionAclConfig)
class SentencePredictionAclTask(SentencePredictionTask):
    """``sentence_prediction`` plus projector snapshots at the start of every N-th validation."""

    def __init__(self, cfg: SentencePredictionAclConfig, data_dictionary, label_dictionary):
        super().__init__(cfg, data_dictionary, label_dictionary)
        self.num_validations = 0
        self._indices: Optional[List[int]] = None
        self._writer = None
        self.projector_logdir = None
        if cfg.projector_every < 0:
            raise ValueError(f"--projector-every must be >= 0 (0 = off), got {cfg.projector_every}")
        if cfg.projector_every > 0:
            if cfg.projector_samples <= 0:
                raise ValueError(f"--projector-samples must be positive, got {cfg.projector_samples}")
            self.projector_logdir = projector.resolve_logdir(cfg.projector_logdir, cfg.tensorboard_logdir)

    def begin_valid_epoch(self, epoch, model):
        super().begin_valid_epoch(epoch, model)
        self.num_validations += 1
        every = self.cfg.projector_every
        if every > 0 and self.num_validations % every == 0 and _is_master():
            self.write_projector_snapshot(model, _num_updates(default=self.num_validations))

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


def _is_master() -> bool:
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def _num_updates(default: int) -> int:
    """The trainer's update count (it logs ``num_updates`` to the always-active default aggregator)."""
    meter = metrics.get_meter("default", "num_updates")
    value = getattr(meter, "val", None) if meter is not None else None
    return int(value) if value is not None else default
