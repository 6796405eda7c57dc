"""Bounded memory per row (issue 40, case 6): each text is cut at a byte budget derived from max_positions
before it is tokenized (acl_fairseq.tokenization.clip), flagged as truncated, on the checkpoint and on its
ONNX folder; a 50 MB line peaks under 1 GB in acl-predict on both (slow: two subprocesses), and texts within
the budget answer as before."""
import os
import subprocess
import sys

import pytest

import helpers
from acl_fairseq import tokenization
from test_text_is_text import pair  # noqa: F401  (the checkpoint and its ONNX folder, built once per module)

PEAK_LIMIT_KB = 1024 * 1024  # 1 GiB, in ru_maxrss's unit


def test_clip_keeps_text_within_the_budget_and_cuts_at_a_character():
    budget = tokenization.byte_budget(4)
    within = " ".join(["é" * 10] * 100)[: budget // 2]
    assert tokenization.clip(f"  {within} \n", 4) == (within, False)
    long = "é" * budget  # 2 bytes each: twice the budget
    cut, flagged = tokenization.clip(long, 4)
    assert flagged and long.startswith(cut) and len(cut.encode("utf-8")) == budget
    cut, _ = tokenization.clip("x" + long, 4)  # the budget falls inside a character: that character goes
    assert len(cut.encode("utf-8")) == budget - 1 and cut.encode("utf-8").decode("utf-8") == cut


def test_a_cut_text_is_flagged_even_when_its_tokens_fit(pair):  # noqa: F811
    """One word longer than the budget is one <unk>: the ids fit, but text was dropped, which the row says."""
    for model in pair:
        budget = tokenization.byte_budget(model.max_positions if hasattr(model, "max_positions")
                                          else model.layout["max_positions"])
        ids, truncated = model.encode_with_info("good " + "x" * (budget + 10))
        assert truncated and len(list(ids)) == 4


def test_the_cut_does_not_change_answers_within_the_budget(pair):  # noqa: F811
    """A text just within the budget gets the ids of its words tokenized whole; one far beyond it the same
    ids (both longer than max_positions tokens), and the same answer."""
    hub, eng = pair
    words = ("the music was not bad " * 100_000)
    budget = tokenization.byte_budget(hub.max_positions)
    within = words[:budget].strip()
    d = hub.task.source_dictionary
    whole = tokenization.dictionary_ids(d, within.split())
    for model in pair:
        ids, truncated = model.encode_with_info(within)
        assert truncated and list(ids)[1:-1] == whole[: hub.max_positions - 2]
        far, far_truncated = model.encode_with_info(words)
        assert far_truncated and list(far) == list(ids)
        near, beyond = model.predict_early_exit([within, words])
        assert near == beyond


def _peak_kb(argv) -> int:
    """Peak RSS of acl-predict run with ``argv``: a wrapper process whose only child it is."""
    wrapper = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL);"
               " print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", wrapper, sys.executable, "-m", "acl_fairseq.cli.predict", *argv],
                         capture_output=True, text=True, cwd=helpers.REPO)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


@pytest.mark.slow
def test_a_50_mb_line_peaks_under_1_gb_on_both_paths(pair, predict_run, tmp_path):  # noqa: F811
    _, data, ckpt = predict_run
    line = tmp_path / "huge.txt"
    with open(line, "w", encoding="utf-8") as f:
        f.write("the music was not bad " * (50 * 2 ** 20 // 22) + "\nthe music was not bad\n")
    for model in (ckpt, pair[1].folder):
        argv = [model, "--input", str(line), "--output", str(tmp_path / f"{os.path.basename(model)}.jsonl")]
        peak = _peak_kb(argv + (["--data", data] if model == ckpt else []))
        assert peak < PEAK_LIMIT_KB, f"{model}: peak RSS {peak / 1024:.0f} MB"
