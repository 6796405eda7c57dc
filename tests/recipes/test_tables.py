"""The one reader of the recipe tables, and the one mean ± std of the reports."""
import glob
import os

import pytest

from acl_runtime.tables import read_tsv
from acl_torch.glue_metrics import mean_std

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_read_tsv_skips_comments_and_blank_lines_and_names_the_bad_line(tmp_path):
    t = tmp_path / "t.tsv"
    t.write_text("# a comment\n\na\tb\n  # indented comment\n1\t2\n3\t4\n")
    assert read_tsv(str(t)) == [{"a": "1", "b": "2"}, {"a": "3", "b": "4"}]
    assert read_tsv(str(t), ["a", "b"])[1]["b"] == "4"
    with pytest.raises(ValueError, match=r"t\.tsv:3: the header must be \['a', 'c'\]"):
        read_tsv(str(t), ["a", "c"])
    t.write_text("a\tb\n1\t2\n1 2\n")
    with pytest.raises(ValueError, match=r"t\.tsv:3: 1 fields, the header has 2"):
        read_tsv(str(t))
    t.write_text("# only a comment\n")
    with pytest.raises(ValueError, match="no header"):
        read_tsv(str(t))


def test_every_recipe_table_reads():
    paths = sorted(glob.glob(os.path.join(REPO, "recipes", "glue", "*.tsv")))
    assert len(paths) >= 4
    for path in paths:
        assert read_tsv(path), path


def test_mean_std_is_the_sample_std_and_none_where_undefined():
    assert mean_std([]) == (None, None)
    assert mean_std([2.0]) == (2.0, None)
    mean, std = mean_std([1.0, 2.0, 3.0])
    assert mean == 2.0 and std == pytest.approx(1.0)  # n - 1 in the denominator
