"""One AclTrainer step of plain SGD (lr 1) on the 16 examples of hf_encoders.ToySet, saved as the parameters' change
and the gate's logged decision: run alone with batch 16, or by ``torchrun --nproc_per_node 2`` with batch 8 per rank
(tests/hf/test_hf_trainer.py compares the two). Usage: hf_ddp_step.py OUT.pt BATCH CRITERION [OPTION=VALUE ...]"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import hf_encoders as hf_encoders  # noqa: E402


def main(out: str, batch: int, criterion: str, *options: str) -> None:
    from transformers import TrainingArguments

    from acl_hf.arguments import CriterionArguments
    from acl_hf.trainer import AclTrainer

    kw = {k: (v == "true") if v in ("true", "false") else float(v) if v[0].isdigit() or v[0] == "-" else v
          for k, v in (o.split("=", 1) for o in options)}
    model = hf_encoders.multi_exit("bert", seed=0)
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    args = TrainingArguments(os.path.dirname(out) + "/trainer", max_steps=1, per_device_train_batch_size=batch,
                             use_cpu=True, report_to="none", save_strategy="no", disable_tqdm=True, optim="sgd",
                             learning_rate=1.0, lr_scheduler_type="constant", max_grad_norm=0.0, weight_decay=0.0,
                             logging_steps=1, seed=3, dataloader_drop_last=True)
    trainer = AclTrainer(model=model, args=args, train_dataset=hf_encoders.ToySet(16),
                         criterion=CriterionArguments(criterion=criterion, **kw))
    trainer.train()
    if trainer.is_world_process_zero():
        logged = [h for h in trainer.state.log_history if "loss" in h][0]
        torch.save({"delta": {k: before[k] - p.detach() for k, p in model.named_parameters()}, "log": logged,
                    "world": trainer.args.world_size}, out)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], *sys.argv[4:])
