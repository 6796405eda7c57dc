"""One optimizer step of Hugging Face's ``Trainer``, as its own loop runs it, for benchmarks/hf_speed.py's trainer
side: the plain ``Trainer`` (cross-entropy inside the model) and :class:`acl_hf.AclTrainer` with each criterion.
What a step is: docs/benchmarks.md, "hf_speed.py"."""
from typing import Dict, List, Optional

import torch

# mode -> (compiled, bf16)
MODES = {"eager": (False, False), "compiled": (True, False), "bf16": (False, True), "compiled-bf16": (True, True)}


def trainer_options(flags: List[str]) -> Dict[str, object]:
    """A criterion's fairseq flags (hf_speed.PLUGIN's) in the Trainer's argument names: ``--scl-weight 0.9`` ->
    ``scl_weight=0.9`` (the exits' weighting is the model's, given to every AclTrainer system alike)."""
    return {flag[2:].replace("-", "_"): float(value) if value[0].isdigit() else value
            for flag, value in zip(flags[::2], flags[1::2]) if flag != "--exit-weighting"}


def skipped(scope: Optional[str], mode: str) -> Optional[str]:
    """Why AclTrainer refuses this (criterion, mode), as its own check says, or None."""
    if scope == "features" and MODES[mode][0]:
        return "the gate's features scope cannot run with --torch_compile (AclTrainer refuses it)"
    return None


class TrainerSystem:
    """A Trainer prepared as ``train()`` prepares it, stepping on one fixed batch (``step``)."""

    def __init__(self, hf_dir: str, batch: Dict, device: str, mode: str, pooling: str, criterion=None, scope=None,
                 exits: str = "top", options: Optional[Dict] = None, backend: str = "inductor", work_dir: str = "."):
        from transformers import AutoModelForSequenceClassification, Trainer, TrainingArguments

        import acl_hf
        from acl_hf.arguments import CriterionArguments
        from acl_hf.trainer import AclTrainer

        compiled, bf16 = MODES[mode]
        self.mode, self.bf16 = mode, bf16
        self.times, self.cpu_times, self.mem = [], [], []
        args = TrainingArguments(
            output_dir=work_dir, report_to=[], use_cpu=device == "cpu",
            per_device_train_batch_size=len(batch["labels"]), learning_rate=2e-5, weight_decay=0.1, adam_beta1=0.9,
            adam_beta2=0.98, adam_epsilon=1e-6, lr_scheduler_type="linear", max_steps=10 ** 6, bf16=bf16,
            torch_compile=compiled, torch_compile_backend=backend if compiled else None, disable_tqdm=True, seed=0)
        torch.manual_seed(0)
        if criterion is None:
            model = AutoModelForSequenceClassification.from_pretrained(hf_dir, num_labels=2)
            self.trainer = Trainer(model=model, args=args)
            self.label_text = "trainer"
        else:
            model = acl_hf.MultiExitForSequenceClassification.from_encoder_pretrained(
                hf_dir, 2, exit_layers=None if exits == "all" else [model_layers(hf_dir)], exit_pooling=pooling,
                exit_weighting="layer", head_dropout=0.1)
            self.trainer = AclTrainer(model=model, args=args,
                                      criterion=CriterionArguments(criterion=criterion, **(options or {})))
            self.label_text = f"acl_hf/{criterion}" + (f"/{scope}" if scope else "") + (
                "/all exits" if exits == "all" else "")
        self.model, _ = self.trainer._prepare_for_training(10 ** 6, None, None)
        self.trainer.current_gradient_accumulation_steps = 1
        self.batch = {k: v.to(device) for k, v in batch.items()}

    def step(self):
        trainer, model = self.trainer, self.model
        (inputs,), num_items = trainer.get_batch_samples(iter([self.batch]), 1, trainer.args.device)
        trainer.accelerator.gradient_state._set_sync_gradients(True)
        trainer.training_step(model, inputs, num_items)
        if trainer.args.max_grad_norm > 0:
            trainer._clip_grad_norm(model)
        trainer.optimizer.step()
        if not trainer.accelerator.optimizer_step_was_skipped:
            trainer.lr_scheduler.step()
        model.zero_grad()


def model_layers(hf_dir: str) -> int:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(hf_dir).num_hidden_layers


def build(args, hf_dir: str, batch: Dict, work_dir: str, criteria: List[tuple]) -> List[TrainerSystem]:
    """The plain Trainer's CE, then AclTrainer with each of ``criteria`` (hf_speed.chosen's rows), in every mode of
    ``args.trainer_modes`` (a criterion the Trainer refuses in a mode is said in one line and left out)."""
    out = []
    for mode in args.trainer_modes:
        out.append(TrainerSystem(hf_dir, batch, args.device, mode, args.pooling, backend=args.compile_backend,
                                 work_dir=work_dir))
        for name, scope, exits, flags in criteria:
            why = skipped(scope, mode)
            if why:
                print(f"# acl_hf/{name}/{scope} {mode} left out: {why}")
                continue
            out.append(TrainerSystem(hf_dir, batch, args.device, mode, args.pooling, name, scope, exits,
                                     trainer_options(flags), args.compile_backend, work_dir))
    return out
