"""The input layout has one home, :func:`acl_runtime.conventions.input_layout`: its rules, its equality with
what the hub built before it existed, its use without torch, and that no other file spells the flag."""
import logging
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

import helpers
from acl_runtime import conventions
from acl_runtime.conventions import SEPARATOR_FLAG, ConventionsError, InputLayout, input_layout, task_layout

A, B = [11, 12, 13], [21, 22]


def record(pair_format, segment_embedding=False):
    return {"pair_format": pair_format, "segment_embedding": segment_embedding}


def hub_before(a, b, init_token, separator, max_positions, eos=2):
    """MultiExitHubInterface.encode_with_info as it was before the layout had a home (ids instead of text)."""
    ids = list(a) + [eos]
    if init_token is not None:
        ids = [init_token] + ids
    if b is not None:
        sep = [separator] if separator is not None else []
        ids += sep + list(b) + [eos]
    truncated = len(ids) > max_positions
    if truncated:
        ids = ids[: max_positions - 1] + [eos]
    return ids, truncated


def test_roberta_double_and_bert_single_layouts():
    roberta = input_layout()
    assert roberta == input_layout(None) == input_layout(record("double")) == InputLayout()
    assert roberta.pair_format == "double" and roberta.separator == (2, 2) and not roberta.segment_embedding
    assert roberta.build(A) == [0, 11, 12, 13, 2]
    assert roberta.build(A, B) == [0, 11, 12, 13, 2, 2, 21, 22, 2]
    assert roberta.fairseq_flags() == ["--init-token", "0", SEPARATOR_FLAG, "2"]
    bert = input_layout(record("single", True))
    assert bert.pair_format == "single" and bert.separator == (2,) and bert.segment_embedding
    assert bert.build(A) == [0, 11, 12, 13, 2]
    assert bert.build(A, B) == [0, 11, 12, 13, 2, 21, 22, 2]  # [CLS] A [SEP] B [SEP]
    assert bert.fairseq_flags() == ["--init-token", "0"]
    assert bert.segment_ids(bert.build(A, B)) == [0, 0, 0, 0, 0, 1, 1, 1]
    assert bert.segment_ids(bert.build(A)) == [0] * 5
    assert SEPARATOR_FLAG == "--separator" + "-token"  # fairseq's spelling
    with pytest.raises(ConventionsError, match="pair_format 'triple'"):
        input_layout(record("triple"))


@pytest.mark.parametrize("init_token, separator", [(0, 2), (0, None), (None, 2), (None, None)])
@pytest.mark.parametrize("b", [None, B, []])
@pytest.mark.parametrize("max_positions", [3, 5, 6, 8, 9, 512])
def test_pairs_are_built_as_the_hub_built_them(init_token, separator, b, max_positions):
    cfg = SimpleNamespace(init_token=init_token, separator_token=separator)  # a sentence_prediction checkpoint
    layout = task_layout(cfg, None)
    assert layout.fit(layout.build(A, b), max_positions) == hub_before(A, b, init_token, separator, max_positions)


def test_a_bare_encoder_follows_its_record_with_bos_first():
    """A masked_lm checkpoint (no separator in its task) takes the record's layout; no record: RoBERTa's."""
    bare = SimpleNamespace(data="x")
    assert task_layout(bare, None) == input_layout()
    assert task_layout(bare, record("single", True)) == input_layout(record("single", True))
    assert task_layout(None, record("single")).build(A, B) == hub_before(A, B, 0, None, 512)[0]


def test_segment_ids_match_the_models_segment_mask():
    import torch

    for layout in (input_layout(record("single")), input_layout()):
        rows = [layout.build(A, B), layout.build(A)]
        width = max(map(len, rows))
        tokens = torch.tensor([r + [1] * (width - len(r)) for r in rows])  # right-padded with <pad> = 1
        mask = conventions.segment_mask(tokens, eos=2, pad=1)
        for r, row in enumerate(rows):
            assert mask[r, : len(row)].int().tolist() == layout.segment_ids(row)
            assert not mask[r, len(row):].any()


def test_the_models_build_check_sets_the_tasks_separator_from_the_layout(caplog):
    task = SimpleNamespace(cfg=SimpleNamespace(separator_token=2, data=None))
    full = {"pair_format": "single", "segment_embedding": True}
    with caplog.at_level(logging.WARNING):
        conventions.apply_to_task(full, task)
    assert task.cfg.separator_token is None and f"{SEPARATOR_FLAG} 2 becomes None" in caplog.text
    caplog.clear()
    conventions.apply_to_task(record("double"), task)
    assert task.cfg.separator_token == 2


def test_the_layout_imports_and_builds_without_torch_or_fairseq():
    """``python -S``: no site-packages, so neither torch nor fairseq can be imported (a serving runtime's case,
    and how recipes/glue/finetune.sh runs acl_fairseq.runs.model_flags)."""
    code = ("import sys\n"
            "from acl_runtime import conventions\n"
            "print(conventions.input_layout({'pair_format': 'single'}).build([5], [6]))\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'fairseq')))\n")
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=helpers.REPO))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[:2] == ["[0, 5, 2, 6, 2]", "[]"]


# Files that may spell the flag besides its home: records of commands that ran (benchmarks/results/: logs
# and command.sh files must stay as they ran), and Markdown prose, which explains fairseq's own option to
# people who run plain fairseq-train and decides nothing the code does. Every code, script, table and test
# file is held to the one home.
HOME = "acl_runtime/conventions.py"
EXEMPT_DIRS = ("benchmarks/results/",)


def test_only_the_home_spells_the_separator_flag():
    listed = subprocess.run(["git", "-C", helpers.REPO, "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], capture_output=True)
    assert listed.returncode == 0, listed.stderr  # CI and developers run from a git checkout
    files = sorted({p for p in listed.stdout.decode().split("\0") if p})
    assert HOME in files and len(files) > 100
    needle = SEPARATOR_FLAG.encode()
    spelled = []
    for path in files:
        if path.startswith(EXEMPT_DIRS):
            continue
        full = os.path.join(helpers.REPO, path)
        if os.path.isfile(full):
            with open(full, "rb") as f:
                if needle in f.read():
                    spelled.append(path)
    fix = "conventions.input_layout(...).fairseq_flags() or `python -m acl_fairseq.runs.model_flags flags`"
    assert spelled == [HOME], f"only {HOME} may spell {SEPARATOR_FLAG}, found in {spelled}: take the flags from {fix}"
