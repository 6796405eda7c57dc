"""Cross-entropy baseline on every exit (MSE with --regression-target), with GLUE metrics.

Registered as ``sentence_ce``. On a multi-exit model the exits' losses are averaged with
``--exit-weighting``. Example: ``--criterion sentence_ce --num-classes 2``.
"""
from dataclasses import dataclass

from fairseq.criterions import register_criterion

from .base import ExitCriterionBase, ExitCriterionConfig


@dataclass
class SentenceCeConfig(ExitCriterionConfig):
    pass


@register_criterion("sentence_ce", dataclass=SentenceCeConfig)
class SentenceCeCriterion(ExitCriterionBase):
    """CE (or MSE) only; everything else is the shared base."""
