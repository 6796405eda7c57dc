"""``AclTrainer``: the criteria of docs/method.md in Hugging Face's ``Trainer``, over
:class:`acl_hf.MultiExitForSequenceClassification`.

- ``compute_loss`` owns the objective (:func:`acl_torch.objective.objective`, the very function the fairseq criteria
  call): one forward asking for every exit's features, the loss in the sum convention divided by the Trainer's
  ``num_items_in_batch`` (the examples of the whole accumulated step, over every rank when
  ``average_tokens_across_devices``), so gradient accumulation and ranks give the large batch's gradient
  (``loss_is_scaled_for_ga``: the Trainer divides by nothing more).
- ACL-Grad's two gradients are taken inside the one ``accelerator.backward`` (the gate is an autograd function), at
  the scaler's scale under fp16: the gate is told that a scaler runs from the accelerator, never from autocast
  (which is off while the loss runs). A thin ``training_step`` reads the gate's decision after the backward.
- ``log`` adds, at every logging step, what the fairseq task logs under the same tag names: each loss term
  (``ce_loss``, ``scl_loss``, ``acl_loss``, ``acl_cl_loss``, ``kd_loss``: in bits per example, as fairseq), ``accuracy``
  and ``accuracy_exit{L}`` (percent), ``grad_cos``, ``conflict_rate`` and ``acl_grad_overflow``; TensorBoard writes
  them under ``train/``. Summed on each rank, added over ranks at logging time.
"""
import math
from collections import defaultdict
from types import SimpleNamespace
from typing import Dict, Optional

import torch
from transformers import Trainer

from acl_torch import acceleration, objective

from .arguments import CriterionArguments, spell

HF_ADVICE = ("Lower --learning_rate, set --max_grad_norm, or check the data; with --fp16 such a step is skipped and "
             "the loss scale lowered")


def build_terms(criterion: CriterionArguments, model) -> objective.Terms:
    """The criterion's :class:`objective.Terms` over ``criterion``'s options and the model's exit weighting, checked:
    a one-line ValueError for a temperature, weight or threshold outside its range, a contrastive criterion on a
    regression head, or a multi-exit criterion on one exit."""
    if criterion.criterion not in objective.TERMS:
        raise ValueError(f"--criterion must be one of {', '.join(objective.TERMS)}, got {criterion.criterion!r}")
    terms = objective.TERMS[criterion.criterion]()
    terms.cfg = SimpleNamespace(**vars(criterion), exit_weighting=model.config.exit_weighting)
    terms.check_options(spell)
    if terms.needs_class_labels and model.regression:
        raise ValueError(f"--criterion {terms.name} needs class labels, but the model has one output (a regression "
                         "task such as STS-B): use --criterion sentence_ce")
    if terms.needs_multi_exit and len(model.layers) < 2:
        raise ValueError(f"--criterion {terms.name} needs at least two exits; the model has one ({model.layers})")
    return terms


class AclTrainer(Trainer):
    loss_is_scaled_for_ga = True  # compute_loss divides by num_items_in_batch itself

    def __init__(self, *args, criterion: Optional[CriterionArguments] = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.criterion = criterion or CriterionArguments()
        model = self.accelerator.unwrap_model(self.model)
        self.terms = build_terms(self.criterion, model)
        self.model_accepts_loss_kwargs = True  # the Trainer then counts num_items_in_batch for compute_loss
        self._check_setup()
        self._sums: Dict[str, torch.Tensor] = defaultdict(lambda: torch.zeros((), dtype=torch.float64))
        self._gate_log: Dict[str, torch.Tensor] = {}

    def _build_accelerator_args(self, **kwargs) -> dict:
        """DDP without ``find_unused_parameters`` unless asked for: the model has no unused parameter (no pooler),
        and with it DDP hands back its outputs through a sink, cutting the features the gate's ``features`` scope
        takes gradients on off the loss."""
        out = super()._build_accelerator_args(**kwargs)
        if self.args.ddp_find_unused_parameters is None:
            for handler in out.get("kwargs_handlers", []):
                if hasattr(handler, "find_unused_parameters"):
                    handler.find_unused_parameters = False
        return out

    def _check_setup(self) -> None:
        args, gate = self.args, self.terms.gate_config()
        if gate is not None and gate.scope == "features" and args.torch_compile:
            raise ValueError("the gate's features scope cannot run with --torch_compile: the compiled graph returns u "
                             "and the logits as separate outputs, so CE has no gradient with respect to u; use the "
                             "params scope, or train without --torch_compile")
        if gate is not None and gate.scope == "features" and args.world_size > 1 and (
                args.ddp_find_unused_parameters or args.ddp_static_graph):
            raise ValueError("the gate's features scope under DDP needs --ddp_find_unused_parameters false and no "
                             "--ddp_static_graph: DDP then returns its outputs through a sink that cuts the features "
                             "off the loss, and no decision could be taken")
        if args.bf16 and args.device.type == "cpu":
            acceleration.check_bf16("cpu", flag="--bf16")  # one line naming the CPU kind where bf16 has no matrix units
        if gate is not None and gate.scope == "params":
            if args.n_gpu > 1:
                raise ValueError("the gate's params scope needs one model per process: DataParallel (several GPUs in "
                                 "one process) is refused; launch with torchrun, or use --acl_grad_scope features")
            if self.is_fsdp_enabled or self.is_deepspeed_enabled:
                raise ValueError("the gate's params scope compares full gradients, which FSDP and DeepSpeed shard: "
                                 "use --acl_grad_scope features, or plain DDP")
        if self.criterion.contrast_across_workers and args.world_size > 1 and not args.dataloader_drop_last:
            raise ValueError("--contrast_across_workers needs --dataloader_drop_last: accelerate pads a short last "
                             "batch with repeated rows, which would be contrasted as positives")

    # ---- the loss ----------------------------------------------------------------------------

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        inputs = dict(inputs)
        labels = inputs.pop("labels")
        outputs = model(**inputs, output_exit_features=True)
        unwrapped = self.accelerator.unwrap_model(model)
        exits = unwrapped.exit_outputs(outputs)
        targets = labels.view(-1)
        parts = objective.objective(
            self.terms, exits, targets, params=unwrapped.parameters, training=model.training,
            loss_scaler=self.accelerator.scaler is not None, regression=unwrapped.regression,
            gather=self.criterion.contrast_across_workers and model.training,
            where=lambda: f"step {self.state.global_step}", advice=HF_ADVICE)
        if num_items_in_batch is None:  # evaluation, or a Trainer that did not count: this batch's mean
            scale = 1.0 / max(parts.n, 1)
        else:
            scale = 1.0 / num_items_in_batch
            if self.args.average_tokens_across_devices and self.accelerator.num_processes > 1:
                scale = scale * self.accelerator.num_processes  # DDP averages; num_items_in_batch counts every rank
        loss = parts.loss * scale
        if model.training:
            self._add(parts, exits, targets)
            # what the Trainer logs as ``loss``: the true objective of this rank's rows at the same scale (under a
            # global contrastive set every rank's loss carries the whole set's term, which only its gradient needs)
            self._logged_loss = parts.total * scale
        if return_outputs:  # what evaluation gathers: the logits of the last exit and of every exit
            return loss, type(outputs)(loss=outputs.loss, logits=outputs.logits, exit_logits=outputs.exit_logits)
        return loss

    def training_step(self, model, inputs, num_items_in_batch=None):
        self._logged_loss = None
        loss = super().training_step(model, inputs, num_items_in_batch)
        for key, value in self._gate_log.items():  # filled in by the backward that just ran
            self._sums[key] += value.detach().double().cpu()
        self._gate_log = {}
        return loss if self._logged_loss is None else self._logged_loss

    # ---- logging -----------------------------------------------------------------------------

    def _add(self, parts: objective.Parts, exits, targets) -> None:
        sums = self._sums
        n = parts.n
        sums["n"] += n
        sums["ce_loss"] += parts.ce.double().cpu()
        for key, value in parts.aux.items():
            sums[key] += value.double().cpu() * n
        if not self.accelerator.unwrap_model(self.model).regression:
            for layer, logits in zip(exits.layers, exits.logits):
                sums[f"ncorrect_exit{layer}"] += (logits.detach().argmax(-1) == targets).sum().double().cpu()
        self._gate_log = parts.gate_log

    def training_scalars(self) -> Dict[str, float]:
        """The scalars since the last logging step, summed over ranks, as the fairseq task names them; then reset."""
        if not self._sums:
            return {}
        keys = sorted(self._sums)
        totals = torch.stack([self._sums[k] for k in keys]).to(self.args.device)
        if self.accelerator.num_processes > 1:
            totals = self.accelerator.reduce(totals, reduction="sum")
        total = dict(zip(keys, totals.tolist()))
        self._sums.clear()
        n = total.pop("n")
        if n == 0:
            return {}
        out = {}
        for key, value in total.items():
            if key.endswith("_loss"):
                out[key] = round(value / n / math.log(2), 3)
        layers = sorted(int(k[len("ncorrect_exit"):]) for k in total if k.startswith("ncorrect_exit"))
        if layers:
            out["accuracy"] = round(100.0 * total[f"ncorrect_exit{layers[-1]}"] / n, 2)
            if len(layers) > 1:
                out.update({f"accuracy_exit{L}": round(100.0 * total[f"ncorrect_exit{L}"] / n, 2) for L in layers})
        for name, (summed, count, digits) in self.terms.logged_ratios.items():
            if total.get(count):
                out[name] = round(total[summed] / total[count], digits)
        for key in self.terms.logged_sums:
            if key in total:
                out[key] = total[key]
        return out

    def log(self, logs: Dict[str, float], start_time: Optional[float] = None) -> None:
        if "loss" in logs:  # a training logging step (evaluation logs carry eval_loss)
            logs = {**logs, **self.training_scalars()}
        super().log(logs, start_time)
