"""acl-train-hf: fine-tune a multi-exit model on a GLUE task with a criterion of docs/method.md, in Hugging Face's
Trainer and its conventions (transformers' run_glue.py names the model and data arguments; docs/hf_trainer.md).

    acl-train-hf --model_name_or_path ENCODER_OR_FOLDER --task_name SST-2 --data_dir glue/SST-2 \\
        --criterion acl_grad --acl_grad_scope params --output_dir runs/sst2 --max_steps 200 \\
        --per_device_train_batch_size 16 --learning_rate 2e-5 --eval_strategy epoch

TrainingArguments are the Trainer's own (``--help`` lists them); the criterion's options are fairseq's flags with
underscores. Writes OUTPUT_DIR/result.json (the fields recipes/collect_results.py reads: the best validation of the
first dev subset by the task's GLUE metric), log_history.json and the final model (save_pretrained). A finished
OUTPUT_DIR is not overwritten without --force; ``--resume_from_checkpoint last`` resumes from its last checkpoint.
Bad arguments and data are refused in one line with exit status 2.
"""
import json
import os
import sys
from dataclasses import dataclass, field
from typing import List, Optional

from acl_runtime import glue_tasks
from acl_runtime.io import atomic
from acl_torch.exit_heads import POOLING_MODES
from acl_torch.losses import EXIT_WEIGHTINGS
from acl_torch.machine import CPU_FLAGS, read_cpu_kind

from .arguments import CriterionArguments


@dataclass
class ModelArguments:
    model_name_or_path: str = field(metadata={"help": "an encoder (any AutoModel folder) or a saved multi-exit folder"})
    tokenizer_name: Optional[str] = field(default=None, metadata={"help": "default: the model's folder"})
    exit_layers: Optional[str] = field(default=None, metadata={
        "help": "comma-separated 1-based layers with an exit; default: every layer (fairseq's --exit-layers)"})
    exit_pooling: str = field(default="cls", metadata={"help": "what each exit reads", "choices": POOLING_MODES})
    exit_weighting: str = field(default="layer", metadata={"help": "the exits' loss weights",
                                                           "choices": EXIT_WEIGHTINGS})
    head_dropout: Optional[float] = field(default=None, metadata={"help": "default: the encoder's classifier dropout"})


@dataclass
class DataTrainingArguments:
    task_name: str = field(metadata={"help": f"one of {', '.join(glue_tasks.TASKS)}"})
    data_dir: str = field(metadata={"help": "the task's GLUE folder (train.tsv, dev.tsv), or a few-shot folder "
                                            "of the same format"})
    max_seq_length: int = field(default=128, metadata={"help": "longer inputs are truncated"})
    max_train_samples: Optional[int] = field(default=None, metadata={"help": "the first N training examples"})
    max_eval_samples: Optional[int] = field(default=None, metadata={"help": "the first N examples of each dev split"})
    few_shot: Optional[int] = field(default=None, metadata={
        "help": "the SCL paper's few-shot protocol: N label-stratified training examples drawn with --seed, the dev "
                "set split into valid (500 others) and test (half), as acl-preprocess --few-shot N --seed S draws "
                "them; the test half is scored at the best validation and written to result.json as test_metrics"})
    method: Optional[str] = field(default=None, metadata={"help": "result.json's method name; default: the criterion"})
    force: bool = field(default=False, metadata={"help": "overwrite an OUTPUT_DIR that holds a result.json"})


class UsageError(ValueError):
    """A bad argument: one line, exit 2."""


def parse(argv: Optional[List[str]]):
    from transformers import HfArgumentParser, TrainingArguments

    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, CriterionArguments, TrainingArguments),
                              description=__doc__.split("\n\n")[0])
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 1 and argv[0].endswith(".json"):  # run_glue.py's one JSON file instead of flags
        return parser.parse_json_file(os.path.abspath(argv[0]))
    return parser.parse_args_into_dataclasses(args=argv)


def check(model_args: ModelArguments, data_args: DataTrainingArguments, training) -> glue_tasks.TaskSpec:
    spec = glue_tasks.get_task(data_args.task_name)
    if not os.path.isdir(data_args.data_dir):
        raise UsageError(f"--data_dir {data_args.data_dir}: no such folder; point it at the unpacked GLUE "
                         f"{spec.name} folder")
    for key in ("max_seq_length", "max_train_samples", "max_eval_samples", "few_shot"):
        value = getattr(data_args, key)
        if value is not None and value < 1:
            raise UsageError(f"--{key} must be a positive integer, got {value}")
    if data_args.few_shot and data_args.max_train_samples:
        raise UsageError("--few_shot N draws the training examples itself: drop --max_train_samples")
    done = os.path.join(training.output_dir, "result.json")
    if os.path.exists(done) and not data_args.force and not training.resume_from_checkpoint:
        raise UsageError(f"{done} exists: a finished run; pass --force to train again into it, or another "
                         "--output_dir")
    return spec


def exit_layers(spec: Optional[str]) -> Optional[List[int]]:
    if spec is None or not spec.strip():
        return None
    try:
        return sorted({int(s) for s in spec.split(",") if s.strip()})
    except ValueError:
        raise UsageError(f"--exit_layers must be comma-separated integers, got {spec!r}") from None


def build_model(model_args: ModelArguments, num_labels: int):
    from transformers import AutoConfig

    from . import MODEL_TYPE, MultiExitForSequenceClassification

    config = AutoConfig.from_pretrained(model_args.model_name_or_path)
    if config.model_type == MODEL_TYPE:
        model = MultiExitForSequenceClassification.from_pretrained(model_args.model_name_or_path)
        if model.num_labels != num_labels:
            raise UsageError(f"{model_args.model_name_or_path} has {model.num_labels} labels, the task {num_labels}")
        return model
    return MultiExitForSequenceClassification.from_encoder_pretrained(
        model_args.model_name_or_path, num_labels, exit_layers=exit_layers(model_args.exit_layers),
        exit_pooling=model_args.exit_pooling, exit_weighting=model_args.exit_weighting,
        head_dropout=model_args.head_dropout)


def best_validation(history: List[dict], subsets: List[str], best_metric: str) -> dict:
    """result.py's fields from the Trainer's log: the best ``subsets[0]`` validation by ``best_metric`` (the last
    of ties, as fairseq keeps it) and the other subsets at that step."""
    first = f"eval_{subsets[0]}_"
    evals = [h for h in history if first + best_metric in h]
    if not evals:
        raise UsageError(f"no validation of {subsets[0]} logged {best_metric}: set --eval_strategy or let the "
                         "final evaluation run")
    best_i, best = max(enumerate(evals), key=lambda ib: (ib[1][first + best_metric], ib[0]))
    out = {"best_epoch": best.get("epoch"), "best_num_updates": best.get("step"), "num_validations": len(evals),
           "best_valid": {}}
    for subset in subsets:
        prefix = f"eval_{subset}_"
        same = [h for h in history if h.get("step") == best.get("step") and any(k.startswith(prefix) for k in h)]
        out["best_valid"][subset] = {k[len(prefix):]: v for h in same for k, v in h.items() if k.startswith(prefix)
                                     and k[len(prefix):] not in ("runtime", "samples_per_second", "steps_per_second")}
    return out


def _read_data(data_args, spec, seed: int, tokenizer):
    """``(train, {name: eval set}, split sizes or None)``: the few-shot protocol's draw under ``seed``, or the
    task's train and dev files, tokenised."""
    from . import data

    if data_args.few_shot:
        return data.few_shot(data_args.data_dir, spec, data_args.few_shot, seed, tokenizer,
                             data_args.max_seq_length, data_args.max_eval_samples)
    train = data.read(data_args.data_dir, spec, "train", "train", tokenizer, data_args.max_seq_length,
                      data_args.max_train_samples)
    evals = {name: data.read(data_args.data_dir, spec, stem, "dev", tokenizer, data_args.max_seq_length,
                             data_args.max_eval_samples) for name, stem in data.dev_subsets(spec).items()}
    return train, evals, None


def _result(trainer, model, spec, data_args, criterion, eval_names: List[str], sizes) -> dict:
    """result.json of the run, in the recipes' format: the best validation by the task's metric, the few-shot
    protocol's test half at it, and the CPU kind."""
    best_metric = spec.best_metric  # the task row's
    result = {"task": spec.name, "method": data_args.method or criterion.criterion, "seed": trainer.args.seed,
              "criterion": criterion.criterion, "arch": f"hf:{model.config.encoder.model_type}",
              "best_metric": best_metric}
    best = best_validation(trainer.state.log_history, eval_names, best_metric)
    tests = {name: best["best_valid"].pop(name) for name in list(best["best_valid"]) if name.startswith("test")}
    result["best_value"] = best["best_valid"][eval_names[0]][best_metric]
    result.update(best)
    if sizes is not None:  # the few-shot protocol: the test half at the best validation (selected on valid alone)
        result.update(few_shot=data_args.few_shot, split_sizes=sizes, test_metrics=tests)
    result["early_exit_json"], result["early_exit_jsons"] = None, {}
    kind = read_cpu_kind()
    result["cpu_kind"], result["cpu_flags"] = kind.describe(), [f for f in CPU_FLAGS if f in kind.flags]
    result["checkpoint"], result["train_log"] = ".", "log_history.json"
    return result


def run(argv: Optional[List[str]] = None) -> dict:
    import transformers
    from transformers import AutoTokenizer, DataCollatorWithPadding
    from transformers.trainer_utils import get_last_checkpoint

    from . import data
    from .trainer import AclTrainer

    model_args, data_args, criterion, training = parse(argv)
    spec = check(model_args, data_args, training)
    transformers.set_seed(training.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name or model_args.model_name_or_path)
    num_labels = 1 if spec.regression else len(spec.labels)
    with training.main_process_first(desc="tokenising"):
        train, evals, sizes = _read_data(data_args, spec, training.seed, tokenizer)
    model = build_model(model_args, num_labels)
    names = data.label_names(spec)
    if names:
        model.config.id2label = dict(enumerate(names))
        model.config.label2id = {n: i for i, n in enumerate(names)}
    trainer = AclTrainer(model=model, args=training, train_dataset=train, eval_dataset=evals, criterion=criterion,
                         processing_class=tokenizer, data_collator=DataCollatorWithPadding(tokenizer),
                         compute_metrics=data.metrics_function(spec, model.layers))
    resume = training.resume_from_checkpoint
    if resume == "last":
        resume = get_last_checkpoint(training.output_dir)
        if resume is None:
            raise UsageError(f"--resume_from_checkpoint last: no checkpoint-* folder in {training.output_dir}")
    trainer.train(resume_from_checkpoint=resume)
    trainer.evaluate()  # the final model's validation, whatever --eval_strategy said
    trainer.save_model(training.output_dir)
    result = _result(trainer, model, spec, data_args, criterion, list(evals), sizes)
    if trainer.is_world_process_zero():
        atomic.write_text(os.path.join(training.output_dir, "log_history.json"),
                          json.dumps(trainer.state.log_history, indent=1) + "\n")
        atomic.write_text(os.path.join(training.output_dir, "result.json"), json.dumps(result, indent=2) + "\n")
    return result


def cli_main(argv: Optional[List[str]] = None) -> None:
    try:
        result = run(argv)
    except (UsageError, glue_tasks.GlueDataError, ValueError) as e:
        print(f"acl-train-hf: error: {str(e).splitlines()[0]}", file=sys.stderr)
        sys.exit(2)
    print(f"acl-train-hf: {result['task']} / {result['method']} / seed {result['seed']}: best "
          f"{next(iter(result['best_valid']))} {result['best_metric']} = {result['best_value']:.2f}")


if __name__ == "__main__":
    cli_main()
