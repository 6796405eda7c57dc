"""FLOPs per example (acl_fairseq/inference/flops.py): the formula by hand, and against torch.utils.flop_counter on
the tiny multi-exit model, example by example at its own length."""

import subprocess
import sys

import pytest
import torch
from torch.utils import flop_counter

import helpers
from acl_fairseq.cli import evaluate
from acl_fairseq.inference import early_exit, flops
from test_models import HEAD, build

SHAPE = flops.Shape(dim=4, ffn_dim=6, head_dim=4, num_classes=3, exit_layers=[1, 3])


def test_layer_and_head_by_hand():
    # T=5, d=4, f=6: projections 4*5*16 = 320, attention 2*25*4 = 200, feed-forward 2*5*4*6 = 240 multiply-adds
    assert flops.layer_flops(5, 4, 6) == 2 * (320 + 200 + 240)
    assert flops.head_flops(SHAPE) == 2 * (4 * 4 + 4 * 3)
    layer, head = flops.layer_flops(5, 4, 6), flops.head_flops(SHAPE)
    assert flops.exit_flops(SHAPE, 5, 0) == layer + head
    assert flops.exit_flops(SHAPE, 5, 1) == 3 * layer + 2 * head  # the first exit's head ran to decide
    assert flops.full_flops(SHAPE, 5) == 3 * layer + head


def test_mean_counts_each_example_at_its_length():
    got = flops.mean_flops(SHAPE, [5, 9], [0, 1])
    assert got == (flops.exit_flops(SHAPE, 5, 0) + flops.exit_flops(SHAPE, 9, 1)) / 2
    # the attention term is quadratic: the mean length would undercount
    assert got > (flops.exit_flops(SHAPE, 7, 0) + flops.exit_flops(SHAPE, 7, 1)) / 2
    with pytest.raises(ValueError, match="one exit per example"):
        flops.mean_flops(SHAPE, [5, 9], [0])


def _cpu_attention(query, key, value, *args, out_shape=None, **kwargs):
    # torch's counter has no rule for the CPU flash kernel that SDPA takes here (it has the CUDA ones): the same
    # count, query and key (B, H, T, d/H), 2 products of T x T x d/H per head
    return flop_counter.sdpa_flop_count(query, key, value)


def counted(fn, *args, **kwargs) -> int:
    mapping = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention}
    with flop_counter.FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        fn(*args, **kwargs)
    return counter.get_total_flops()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    task, model, _ = build(helpers.make_data(str(tmp_path_factory.mktemp("data")))["data"])
    task.load_dataset("valid")
    return task.dataset("valid"), model


def test_full_model_agrees_with_torch_flop_counter(tiny):
    ds, model = tiny
    shape = evaluate.model_shape(model, HEAD)
    assert shape == flops.Shape(dim=12, ffn_dim=20, head_dim=12, num_classes=2, exit_layers=[1, 2, 3])
    lengths = set()
    for i in range(8):
        tokens = ds.collater([ds[i]])["net_input"]["src_tokens"]
        length = int(ds.num_tokens(i))
        assert tokens.shape == (1, length)  # the length the count takes is the example's real length
        lengths.add(length)
        torch_count = counted(early_exit.full_forward, model, tokens, HEAD)
        assert flops.full_flops(shape, length) == pytest.approx(torch_count, rel=0.02)
        # every exit run (the engine's full pass): all layers and all three heads
        torch_count = counted(early_exit.early_exit_forward, model, tokens, HEAD, policy=None)
        assert flops.exit_flops(shape, length, 2) == pytest.approx(torch_count, rel=0.02)
    assert len(lengths) > 2, "want several lengths, so that the quadratic term is tested"


def test_early_exit_at_the_first_exit_agrees_with_torch_flop_counter(tiny):
    ds, model = tiny
    shape = evaluate.model_shape(model, HEAD)
    tokens = ds.collater([ds[0]])["net_input"]["src_tokens"]
    # entropy threshold 1.0 fires at the first exit for any row that is not exactly uniform
    out = early_exit.early_exit_forward(model, tokens, HEAD, policy="entropy", threshold=1.0)
    assert out.exit_index.tolist() == [0]
    torch_count = counted(early_exit.early_exit_forward, model, tokens, HEAD, policy="entropy", threshold=1.0)
    assert flops.exit_flops(shape, tokens.shape[1], 0) == pytest.approx(torch_count, rel=0.02)


def test_the_formula_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None; sys.modules['fairseq'] = None\n"
            "from acl_fairseq.inference import flops\n"
            "print(flops.full_flops(flops.Shape(4, 6, 4, 3, [1, 3]), 5))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=helpers.REPO)
    assert out.stdout.strip() == str(flops.full_flops(SHAPE, 5))
