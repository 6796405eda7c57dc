"""benchmarks/fewshot.py end to end at a toy size: a tiny random HF BERT (converted with acl-convert-hf), a tiny
GLUE-format SST-2 folder, N=8, 2 seeds, CE and SCL through recipes/glue/finetune.sh, then acl-evaluate
on the labelled test half; checks fewshot.json's fields, the markdown table and the PNG."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from acl_fairseq.hf import convert as convert_hf
from toy_data import FILLERS, INTENSIFIERS, NEGATIONS, NEGATIVE, POSITIVE, SUBJECTS, make_examples

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# CE and the paper's CE+SCL keep the test within a minute or two on a busy 2-core machine; the ACL criteria run
# through the same driver path (their criteria have their own tests)
METHODS = ["ce", "scl"]
# each toy run's best validation loss (CE; CE + SCL), measured twice on a 2-core x86 CPU
VALID_LOSS = {("ce", 1): 1.024, ("ce", 2): 1.018, ("scl", 1): 2.275, ("scl", 2): 2.243}

WORDS = sorted({w for phrase in POSITIVE + NEGATIVE + SUBJECTS + INTENSIFIERS + FILLERS + NEGATIONS + ["was"]
                for w in phrase.split()})
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + sorted({".", ",", "!"} - set(WORDS))


def write_tiny_bert(hf_dir):
    import transformers  # here, not at the top: the other tests of this file do not need it

    config = transformers.BertConfig(vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=24, max_position_embeddings=64, type_vocab_size=2,
                                     pad_token_id=0)
    torch.manual_seed(0)  # the random weights, and so the accuracies the test knows, are the same every run
    transformers.BertForPreTraining(config).save_pretrained(hf_dir)
    with open(os.path.join(hf_dir, "vocab.txt"), "w") as f:
        f.write("\n".join(VOCAB) + "\n")


def write_sst2(folder):
    os.makedirs(folder)
    for name, n, seed in (("train.tsv", 60, 1), ("dev.tsv", 24, 2)):
        with open(os.path.join(folder, name), "w") as f:
            f.write("sentence\tlabel\n")
            for text, _, label in make_examples(n, seed):
                f.write(f"{text}\t{label}\n")


@pytest.mark.slow  # a benchmark end to end (make test-slow, CI)
def test_fewshot_benchmark_toy_end_to_end(tmp_path):
    write_tiny_bert(str(tmp_path / "hf"))
    convert_hf.convert(str(tmp_path / "hf"), str(tmp_path / "enc"))
    write_sst2(str(tmp_path / "SST-2"))
    results = tmp_path / "results"
    cmd = [sys.executable, os.path.join(REPO, "benchmarks", "fewshot.py"), "--toy",
           "--encoder-dir", str(tmp_path / "enc"), "--glue-dir", str(tmp_path / "SST-2"),
           "--work", str(tmp_path / "work"), "--results", str(results), "--methods", *METHODS]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]

    with open(results / "fewshot.json") as f:
        summary = json.load(f)
    assert summary["protocol"]["toy"] is True and summary["protocol"]["task"] == "SST-2"
    assert "10.7" in summary["paper"]
    cells = {(c["n"], c["method"]): c for c in summary["cells"]}
    assert set(cells) == {(8, m) for m in METHODS}
    for c in cells.values():
        assert c["num_seeds"] == 2 and c["seeds"] == [1, 2]
        # known values, measured twice (identical) on a 2-core x86 CPU: 7 of the 12 test and 6 of the 12 valid
        # examples right for every method and seed (f1 0 on valid: one class, from random weights and 8
        # examples); the valid losses below tell the runs apart
        assert c["test_accuracy"] == pytest.approx([100 * 7 / 12] * 2, abs=1e-6)
        assert c["valid_accuracy"] == pytest.approx([50.0, 50.0], abs=1e-6)
        assert c["test_accuracy_mean"] == pytest.approx(sum(c["test_accuracy"]) / 2)
        assert c["test_accuracy_std"] is not None and c["test_accuracy_std"] >= 0
        assert len(c["valid_accuracy"]) == 2
    assert {(d["n"], d["method"]) for d in summary["paired_delta_vs_ce"]} == {(8, m) for m in METHODS[1:]}
    assert len(summary["runs"]) == 2 * len(METHODS)
    for r in summary["runs"]:
        # fairseq logs the losses to 3 decimals, hence 2e-3, far above another CPU's reduction order (~1e-6)
        assert r["valid_metrics"]["loss"] == pytest.approx(VALID_LOSS[r["method"], r["seed"]], abs=2e-3)
        # the protocol: 8 training examples, test = half the dev set (12), valid = the other 12, all labelled
        stats = json.load(open(tmp_path / "work" / "data" / "fewshot" / f"SST-2-N8-seed{r['seed']}-bin" / "stats.json"))
        assert stats["splits"]["train"]["examples"] == 8
        assert stats["splits"]["test"]["examples"] == 12 and stats["splits"]["valid"]["examples"] == 12
        assert r["best_num_updates"] is not None and r["best_num_updates"] <= r["total_updates"]
    md = (results / "fewshot.md").read_text()
    assert "| method | N=8 |" in md and "Δ scl − ce" in md and "Paper:" in md
    # the converted encoder's conventions record is the pipeline the table was trained with
    assert summary["protocol"]["conventions"] == {"family": "bert", "head_dropout": 0.1, "pair_format": "single"}
    assert "head dropout 0.1 (its conventions record)" in md
    png = results / "fewshot.png"
    assert png.stat().st_size > 1000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # a second call skips every finished run and rebuilds the same table
    proc2 = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert proc2.returncode == 0, proc2.stderr[-3000:]
    assert "train:" not in proc2.stderr
    with open(results / "fewshot.json") as f:
        assert json.load(f)["cells"] == summary["cells"]

    # the runs' records (RESULTS/runs/fewshot/...) rebuild the table on a machine without the work folder
    assert (results / "runs" / "fewshot" / "N8" / "runs" / "SST-2" / "scl" / "seed2" / "fewshot_result.json").is_file()
    shutil.rmtree(tmp_path / "work")
    (results / "fewshot.json").unlink()
    proc3 = subprocess.run(cmd + ["--collect-only"], capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert proc3.returncode == 0, proc3.stderr[-3000:]
    with open(results / "fewshot.json") as f:
        assert json.load(f)["cells"] == summary["cells"]

    # --trainer hf: the same protocol through acl-train-hf on the HF folder, paired with the fairseq run of its seed
    hf = cmd[:cmd.index("--methods")] + ["--methods", "ce", "--seeds", "1", "--trainer", "hf", "--hf-dir",
                                         str(tmp_path / "hf")]
    proc5 = subprocess.run(hf, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert proc5.returncode == 0, proc5.stdout[-3000:] + proc5.stderr[-5000:]
    record = results / "runs" / "fewshot_hf" / "N8" / "runs" / "SST-2" / "ce" / "seed1"
    hf_run = json.loads((record / "fewshot_result.json").read_text())
    assert hf_run["trainer"] == "hf" and hf_run["split_sizes"] == {"train": 8, "valid": 12, "test": 12}
    command = (record / "command.sh").read_text()
    assert "acl_hf.train" in command and "--few_shot 8" in command
    pairs = json.loads((results / "hf_fewshot_accuracy.json").read_text())
    assert [(c["n"], c["method"], c["seeds"]) for c in pairs["paired"]] == [(8, "ce", [1])]
    fairseq_accuracy = cells[8, "ce"]["test_accuracy"][0]
    assert pairs["paired"][0]["hf_minus_fairseq_per_seed"] == [hf_run["test_accuracy"] - fairseq_accuracy]
    trained = tmp_path / "work" / "fewshot_hf" / "N8" / "runs" / "SST-2" / "ce" / "seed1"
    assert not any(name.endswith(".safetensors") for name in os.listdir(trained))  # the weights are not kept
    assert sorted(os.listdir(record)) == ["command.sh", "fewshot_result.json", "result.json", "train.log"]

    # --bf16: the same run in bf16 autocast, in its own folder and records, paired with its fp32 record
    bf16 = [c for c in cmd if c not in METHODS[1:]]
    bf16[bf16.index("--methods") + 1:bf16.index("--methods") + 2] = ["ce", "--seeds", "1", "--bf16"]
    proc4 = subprocess.run(bf16, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    from acl_torch import acceleration

    if acceleration.read_cpu_kind().bf16_unit is None:  # an AVX2-only CPU: refused, not 40x slower
        assert proc4.returncode != 0 and "no native bf16" in proc4.stdout + proc4.stderr
        return
    assert proc4.returncode == 0, proc4.stdout[-3000:] + proc4.stderr[-5000:]
    record = results / "runs" / "fewshot_bf16" / "N8" / "runs" / "SST-2" / "ce" / "seed1"
    assert "--autocast-bf16" in (record / "command.sh").read_text()
    assert "--autocast-bf16" not in (results / "runs" / "fewshot" / "N8" / "runs" / "SST-2" / "ce" / "seed1" /
                                     "command.sh").read_text()
    pairs = json.loads((results / "bf16_fewshot_accuracy.json").read_text())
    assert [(c["n"], c["method"], c["seeds"]) for c in pairs["paired"]] == [(8, "ce", [1])]
    assert pairs["rows"][1]["test_accuracy"] == cells[8, "ce"]["test_accuracy"][0]  # the fp32 twin, from its record
    assert "--bf16" in pairs["command"] and pairs["cpu_kind"] and pairs["threads"] == 2
    with open(results / "fewshot.json") as f:
        assert json.load(f)["cells"] == summary["cells"]  # the fp32 table stays


def test_bf16_runs_are_paired_with_the_fp32_run_of_the_same_cell_and_seed():
    import _fewshot as FS

    def run(method, seed, acc, n=1000):
        return {"n": n, "method": method, "seed": seed, "test_accuracy": acc, "valid_accuracy": 80.0}

    fp32 = [run("ce", 1, 80.0), run("ce", 2, 79.0), run("acl_embed", 1, 81.0), run("ce", 1, 70.0, n=100)]
    bf16 = [run("ce", 2, 79.5), run("ce", 1, 80.0), run("acl_embed", 1, 80.5), run("acl_embed", 3, 82.0)]
    out = FS.twin_pairs(bf16, fp32, "precision", ("bf16", "fp32"), FS.BF16_BOUND)  # as fewshot.py's PAIRS["bf16"]
    by = {(c["n"], c["method"]): c for c in out["paired"]}
    assert set(by) == {(1000, "ce"), (1000, "acl_embed")}
    assert by[1000, "ce"]["seeds"] == [1, 2] and by[1000, "ce"]["bf16_minus_fp32_per_seed"] == [0.0, 0.5]
    assert by[1000, "ce"]["max_abs"] == 0.5 and by[1000, "ce"]["within_0.3_points"] is False
    assert by[1000, "acl_embed"]["bf16_minus_fp32_per_seed"] == [-0.5] and by[1000, "acl_embed"]["ci95"] == [None, None]
    assert out["unpaired"] == ["N=1000 acl_embed seed 3"]  # no fp32 twin: left out, and named
    assert {(r["precision"], r["seed"]) for r in out["rows"] if r["method"] == "ce"} == {
        ("bf16", 1), ("fp32", 1), ("bf16", 2), ("fp32", 2)}
    assert FS.study(True) != FS.study(False)  # the two precisions never share a run folder or a record


def _fewshot_module():
    import fewshot  # benchmarks/fewshot.py (benchmarks/ is on the path: conftest.py)
    return fewshot


def test_fewshot_schedules_come_from_the_recipe_table_with_reasons():
    import _fewshot

    table = _fewshot.read_schedules()
    assert sorted(table) == [20, 100, 1000]  # the SCL paper's N
    for n, s in table.items():
        assert s["batch"] >= 2 and s["epochs"] >= 1 and 1 <= s["every"] <= s["epochs"] and 0 < s["lr"] < 1e-3
        assert len(s["reason"]) > 40, f"N={n}: every schedule carries its reason"
        assert _fewshot.schedule_for(n, toy=False) == s
    # N=20 trains on the whole set as one batch, so every anchor has same-label positives
    assert table[20]["batch"] == 20


def test_fewshot_schedule_table_errors_name_the_file_and_the_problem(tmp_path):
    import _fewshot

    bad_header = tmp_path / "h.tsv"
    bad_header.write_text("# comment\nn\tbatch\tepochs\n20\t20\t30\n")
    with pytest.raises(ValueError, match=r"h\.tsv:2: the header must be"):
        _fewshot.read_schedules(str(bad_header))
    short_row = tmp_path / "r.tsv"
    short_row.write_text("n\tbatch_size\tepochs\tvalidate_every\tlr\treason\n20 20 30 10 1e-4 spaces not tabs\n")
    with pytest.raises(ValueError, match=r"r\.tsv:2: 1 fields, the header has 6: separate the fields with tabs"):
        _fewshot.read_schedules(str(short_row))


def test_fewshot_keeps_a_table_it_cannot_rebuild_and_one_of_another_protocol(tmp_path):
    fewshot = _fewshot_module()
    enc = tmp_path / "enc"
    enc.mkdir()
    with pytest.raises(SystemExit):  # a toy run would record its runs beside the real ones
        fewshot.main(["--toy", "--encoder-dir", str(enc), "--collect-only"])
    results = tmp_path / "results"
    results.mkdir()
    table = results / "fewshot.json"
    table.write_text(json.dumps({"protocol": {"encoder": "MiniLM", "toy": False}, "cells": [1]}))
    base = ["--toy", "--encoder-dir", str(enc), "--results", str(results), "--work", str(tmp_path / "w"),
            "--collect-only"]
    with pytest.raises(SystemExit):
        fewshot.main(base)
    assert json.loads(table.read_text())["cells"] == [1]
    # --force may replace it, but not with nothing: no runs, no records, the table stays
    assert fewshot.main(base + ["--force"]) == 1
    assert json.loads(table.read_text())["cells"] == [1] and not (results / "fewshot.md").exists()


def test_a_finished_fewshot_run_of_another_schedule_or_from_before_the_conventions_record_is_refused(tmp_path):
    import _fewshot
    import _glue_runs as glue_runs
    fewshot = _fewshot_module()

    enc = tmp_path / "enc"
    enc.mkdir()
    (enc / "conventions.json").write_text("{}")
    sch = _fewshot.schedule_for(20, toy=False)
    rd = tmp_path / "run"
    rd.mkdir()
    (rd / "fewshot_result.json").write_text(json.dumps({"schedule": sch}))
    command = f"fairseq-train x --lr {sch['lr']:g} --exit-pooling mean --max-epoch {sch['epochs']} --conventions c.json"
    (rd / "command.sh").write_text(command + "\n")
    fewshot.check_finished(str(rd), sch, glue_runs.Encoder(str(enc)))  # the same schedule and record: it may be reused
    with pytest.raises(SystemExit, match="move it away"):
        fewshot.check_finished(str(rd), dict(sch, lr=sch["lr"] / 2), glue_runs.Encoder(str(enc)))
    (rd / "command.sh").write_text(command.replace(" --conventions c.json", "") + "\n")  # an earlier pipeline's
    with pytest.raises(SystemExit, match="conventions record absent; this run asks for .* record passed"):
        fewshot.check_finished(str(rd), sch, glue_runs.Encoder(str(enc)))


def test_fewshot_bf16_on_a_cpu_without_bf16_units_is_refused_before_any_run(tmp_path, monkeypatch, capsys):
    """Refused in one line at the start (the rule of acl_torch.acceleration.bf16_problem), not by each run."""
    from acl_torch import acceleration
    from acl_torch.machine import read_cpu_kind
    from test_acceleration import ROME

    fewshot = _fewshot_module()
    monkeypatch.setattr(acceleration, "read_cpu_kind", lambda text=None: read_cpu_kind(ROME))
    monkeypatch.setattr(fewshot.harness, "grid", lambda *a, **k: pytest.fail("no run may start"))
    with pytest.raises(SystemExit) as refused:
        fewshot.main(["--toy", "--bf16", "--encoder-dir", str(tmp_path), "--results", str(tmp_path / "r"),
                      "--work", str(tmp_path / "w")])
    err = capsys.readouterr().err.strip().splitlines()
    assert refused.value.code == 2 and "--bf16: this CPU (AMD EPYC 7B12, AVX2 only" in err[-1]
