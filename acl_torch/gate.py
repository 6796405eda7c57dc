"""The ACL-Grad rule (the one home of its gate, for both trainers): drop the auxiliary (ACL) term of a batch
when its gradient conflicts with CE's.

The same gate serves ``acl_grad``, ``acl_cross_layer`` and ``sentence_scl --scl-grad`` (the rule on the SCL
term), and, with ``apply=False``, ``--log-grad-conflict``: both gradients are taken and the cosine logged,
but the update is always ``g_ce + g_aux``.

Both scopes of METHOD.md:
- ``params`` (exact): the gradients of ``ce`` and ``aux`` over every trainable parameter, with two
  ``autograd.grad`` calls; the update is ``g_ce`` or ``g_ce + g_aux``, handed to the parameters
  directly (no third pass through the encoder).
- ``features`` (cheap): the gradients with respect to the exits' representations ``u`` only; the
  chosen loss ``ce`` or ``ce + aux`` then back-propagates once, as an ordinary backward.

**When: inside the backward pass.** The objective returns a loss whose backward (:class:`_Gate`)
takes the decision. It receives the trainer's loss scale as its incoming gradient ``S`` (``--fp16`` and
``--memory-efficient-fp16`` back-propagate ``loss * scale``, ``--amp`` ``GradScaler.scale(loss)``,
a replayed (dummy) batch ``loss * 0``), so both gradients are taken at the same scale as any plain
backward: fp16 flushes no more entries to zero than a plain backward does, and an overflow is an
ordinary overflow. The cosine is scale-invariant, so the decision is the fp32 one.

**Non-finite gradients never decide.** An inf or NaN in either gradient makes the cosine NaN (see
``gradients.cosine_from_sums``). With a loss scaler (``--fp16``, ``--amp``) the term is then kept, so
the inf/NaN reaches fairseq's optimizer, which skips the step and lowers the scale; the step counts
in ``acl_grad_overflow``, not in ``grad_cos``/``conflict_rate`` (fairseq-train drops an overflowed update's
logging altogether). A gradient that is exactly 0 (SupCon without a positive pair) has no direction: the
term is kept and the step not counted. Without one (fp32, bf16) the
backward raises ``FloatingPointError`` naming the update. The caller says whether a scaler runs
(fairseq's criteria from the model's dtype and autocast, ``acl_fairseq.criterions.gating``; the Hugging Face trainer
from its accelerator's scaler, never from autocast, which is off while its loss runs).

**Where the decision is taken.**
- By default on each worker's own micro-batch, from its *local* gradients, once per backward. With
  ``--update-freq > 1`` each micro-batch decides for itself (the paper's rule is per mini-batch).
  Under DDP every rank decides on its local gradients, so ranks may disagree within one update:
  the applied update is the sum of each rank's chosen gradient.
- With ``--acl-grad-global-decision`` and more than one worker, on the gradients summed over the
  ranks: ``params`` all-reduces ``g_ce`` and ``g_aux`` (two gradient-sized all-reduces per step, in
  float32) before the cosine; ``features`` all-reduces the three sums ``<g_ce, g_aux>``, ``|g_ce|^2``,
  ``|g_aux|^2`` over every rank's rows (the feature gradients of different rows are disjoint
  coordinates of the concatenated batch), and only where a sum overflowed or underflowed float32, the
  largest entries (a 2-number max) and the sums of the rescaled gradients. Every rank takes
  the same decision. A replayed batch back-propagates ``loss * 0``, so its rank adds exact zeros.
  Together with ``--contrast-across-workers`` it equals the single-process decision on the
  concatenated batch. Each rank still back-propagates only its own chosen gradient; DDP sums them.

The logged ``grad_cos``, ``conflict``, ``gated_steps`` and ``acl_grad_overflow`` are tensors of the
logging output that the backward fills in (fairseq reads them after the backward).
"""
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from . import distributed, gradients
from .exit_heads import ExitOutputs

SCOPES = ("params", "features")  # --acl-grad-scope: the two scopes above
# the logging keys the gate fills in, as a criterion declares them (ExitCriterionBase.logged_ratios/_sums)
LOGGED_RATIOS = {"grad_cos": ("grad_cos", "gated_steps", 4), "conflict_rate": ("conflict", "gated_steps", 3)}
LOGGED_SUMS = ("acl_grad_overflow",)
# what the raised error advises, in fairseq's flags (the Hugging Face trainer passes its own)
FAIRSEQ_ADVICE = ("Lower --lr, set --clip-norm, or check the data; with --fp16 or --amp such a step is skipped and "
                  "the loss scale lowered")


@dataclass(frozen=True)
class GateConfig:
    """The gate's settings, passed in by the criterion from its own flags (``--acl-grad-*`` for ACL-Grad)."""

    scope: str  # one of SCOPES
    threshold: float  # the auxiliary part is dropped when cos(g_ce, g_aux) is below it
    global_decision: bool = False  # decide on the gradients summed over all workers
    apply: bool = True  # False: only measure (log grad_cos and conflict), always keep the auxiliary part

    def __post_init__(self):
        if self.scope not in SCOPES:
            raise ValueError(f"gate scope {self.scope!r} is not one of {', '.join(SCOPES)}")


def combine(
    params: Callable[[], Sequence[torch.Tensor]], exits: ExitOutputs, ce: torch.Tensor, aux: torch.Tensor,
    config: GateConfig, training: bool, loss_scaler: bool, features: Optional[Sequence[torch.Tensor]] = None,
    where: Callable[[], str] = lambda: "this step", advice: str = FAIRSEQ_ADVICE,
) -> Tuple[torch.Tensor, Dict]:
    """``ce + aux`` outside training (or where nothing needs a decision), else :func:`gate`'s choice between
    ``ce`` and ``ce + aux`` in the backward. ``params``: returns the model's parameters (read only when the
    ``params`` scope needs them). ``features``: the representations the ``features`` scope compares gradients on
    (default: the exits' ``u``).

    Every rank of a global decision enters the gate, even one whose ``aux`` reaches nothing, since
    the decision's collectives run in every rank's backward.
    """
    if not (training and torch.is_grad_enabled() and ce.requires_grad):
        return ce + aux, {}
    if not (aux.requires_grad or config.global_decision):
        return ce + aux, {}
    return gate(params, exits, ce, aux, config.scope, config.threshold, global_decision=config.global_decision,
                loss_scaler=loss_scaler, apply=config.apply, features=features, where=where, advice=advice)


def gate(
    params: Callable[[], Sequence[torch.Tensor]],
    exits: Optional[ExitOutputs],
    ce: torch.Tensor,
    aux: torch.Tensor,
    scope: str,
    threshold: float,
    global_decision: bool = False,
    loss_scaler: bool = False,
    apply: bool = True,
    features: Optional[Sequence[torch.Tensor]] = None,
    where: Callable[[], str] = lambda: "this step",
    advice: str = FAIRSEQ_ADVICE,
) -> Tuple[torch.Tensor, Dict]:
    """Return ``(loss to back-propagate, logging entries)`` under the ACL-Grad rule.

    ``params``: a callable returning the model's parameters (the ``params`` scope compares the gradients over
    those that require one). ``apply=False`` measures only: the logged ``conflict`` is still the rule's decision,
    but the auxiliary part is always kept. ``global_decision``: decide on the gradients summed over all workers
    (no effect outside distributed training). ``loss_scaler``: training runs with a dynamic loss scaler, which
    skips a step whose gradients overflowed; without one a non-finite gradient raises ``FloatingPointError``
    naming ``where()`` (e.g. "update 12") and giving ``advice``.
    """
    zero = ce.new_zeros((), dtype=torch.float32)
    log = {"grad_cos": zero.clone(), "conflict": zero.clone(), "gated_steps": zero.clone(),
           "acl_grad_overflow": zero.clone()}
    gate_state = _GateState(
        ce=ce, aux=aux, scope=scope, threshold=threshold, log=log, loss_scaler=loss_scaler, apply=apply,
        global_decision=global_decision and distributed.world_size() > 1, where=where, advice=advice,
    )
    if scope == "features":
        gate_state.inputs = [u for u in (exits.features if features is None else features) if u.requires_grad]
        return _Gate.apply(gate_state, ce, aux), log
    gate_state.inputs = [p for p in params() if p.requires_grad]
    return _Gate.apply(gate_state, *gate_state.inputs), log


class _GateState:
    """What the backward needs; kept on the autograd context, off the graph's inputs."""

    def __init__(self, **kw):
        self.inputs: List[torch.Tensor] = []
        self.__dict__.update(kw)


class _Gate(torch.autograd.Function):
    """Value: ``ce + aux``. Backward: the ACL-Grad choice at the incoming scale (see the module doc).

    Inputs: ``(state, ce, aux)`` for the features scope (the chosen loss then back-propagates as usual),
    ``(state, *params)`` for the params scope (the chosen gradient goes to the parameters directly).
    """

    @staticmethod
    def forward(ctx, state: _GateState, *tensors):
        ctx.state = state
        return (state.ce.detach() + state.aux.detach()).float()

    @staticmethod
    def backward(ctx, scale):
        st: _GateState = ctx.state
        ctx.state = None  # free the graph references as soon as they are used
        features = st.scope == "features"
        g_ce = _grad(st.ce, st.inputs, scale, retain=True)
        g_aux = _grad(st.aux, st.inputs, scale, retain=features)
        cos, defined = _cosine(st.inputs, g_ce, g_aux, features, st.global_decision)
        finite = torch.isfinite(cos)
        if not st.loss_scaler and not bool(finite):
            raise FloatingPointError(
                f"ACL-Grad at {st.where()}: the CE or ACL gradient has inf/NaN entries "
                f"(no loss scaler to skip the step). {st.advice}"
            )
        # NaN keeps: the overflow reaches the optimizer. An exact-0 gradient (SupCon without a positive pair in
        # the batch) has no direction: nothing to decide, and the step is not counted
        keep = gradients.acl_grad_keep(cos, st.threshold) | ~defined
        decided = finite & defined
        st.log["grad_cos"].copy_(torch.where(decided, cos, torch.zeros_like(cos)))
        st.log["conflict"].copy_((~keep).float())
        if not st.apply:  # measuring only: the update is ce + aux whatever the rule says
            keep = torch.ones_like(keep)
        st.log["gated_steps"].copy_(decided.float())
        st.log["acl_grad_overflow"].copy_((~finite).float())
        if features:
            return None, scale, scale * keep.to(scale.dtype)
        return (None, *_chosen(st.inputs, g_ce, g_aux, keep))


def _grad(loss: torch.Tensor, inputs: Sequence[torch.Tensor], scale: torch.Tensor, retain: bool):
    if loss.grad_fn is None or not inputs:  # e.g. no local rows reach the term
        return [None] * len(inputs)
    return torch.autograd.grad(loss, inputs, grad_outputs=scale.to(loss.dtype).expand_as(loss),
                               retain_graph=retain, allow_unused=True)


def _cosine(inputs, g_ce, g_aux, features: bool, global_decision: bool) -> torch.Tensor:
    """``gradients.gradient_cosine_defined``, or that of the gradients over all workers (the same on every rank).

    ``params``: the per-parameter gradients are summed over ranks, then compared. ``features``: each
    rank holds the gradients of its own rows, so the sums of the concatenation are the all-reduced
    per-rank sums, once every rank uses the same (all-reduced) scales.
    """
    if not global_decision:
        return gradients.gradient_cosine_defined(g_ce, g_aux)
    if features:
        return gradients.gradient_cosine_defined(g_ce, g_aux, sum_over=_all_reduce_sum,
                                                 max_over=distributed.all_reduce_max)

    def summed(grads):  # every rank reduces the same shapes (None as 0); None stays "not reached"
        total = distributed.all_reduce_sum([torch.zeros_like(x) if g is None else g for x, g in zip(inputs, grads)])
        return [None if g is None else t for g, t in zip(grads, total)]

    return gradients.gradient_cosine_defined(summed(g_ce), summed(g_aux))


def _all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    (total,) = distributed.all_reduce_sum([x])
    return total


def _chosen(params, g_ce, g_aux, keep: torch.Tensor) -> List[Optional[torch.Tensor]]:
    """``g_ce + keep * g_aux`` per parameter, summed in float32 and rounded once to its dtype.

    ``keep`` multiplies (never selects), so an inf/NaN in a dropped ``g_aux`` still reaches the
    optimizer as an overflow.
    """
    out: List[Optional[torch.Tensor]] = []
    for p, gc, ga in zip(params, g_ce, g_aux):
        if gc is None and ga is None:
            out.append(None)
            continue
        g = 0.0 if gc is None else gc.float()
        if ga is not None:
            g = g + ga.float() * keep.to(torch.float32)
        out.append(g.to(p.dtype))
    return out
