"""The early-exit loop both engines share (acl_runtime.loop), on a numpy backend of its own: the loop
against the offline policy form of acl_runtime.exits on every row alone, batch 1 against batched, the exit request
resolved once at the edge. No torch: the loop and its edge are what a serving install runs."""
import math

import numpy as np
import pytest

from acl_runtime import exits, loop

PAD = 1


class MeanBackend:
    """A toy encoder: each layer mixes every position with the mean of the row's real positions (so padding and
    the rows leaving the batch matter), an exit reads the mean through its own matrix."""

    pad = PAD

    def __init__(self, num_layers=4, exit_layers=(1, 2, 3, 4), dim=6, num_classes=3, scale=3.0, seed=0):
        rng = np.random.default_rng(seed)
        self.exit_layers, self.num_classes = list(exit_layers), num_classes
        self.table = rng.normal(size=(32, dim)).astype(np.float32)
        self.mix = [rng.normal(size=(dim, dim)).astype(np.float32) / math.sqrt(dim) for _ in range(num_layers)]
        base = rng.normal(size=(dim, num_classes))  # exits that mostly agree, so that patience fires too
        self.heads = {i: (scale * (base + 0.5 * rng.normal(size=base.shape))).astype(np.float32) for i in exit_layers}
        self.calls = []  # (layer, rows, length) of every layer call

    def embed(self, ids, mask):
        x = self.table[np.asarray(ids)] * ~mask[..., None]
        return np.ascontiguousarray(x.transpose(1, 0, 2))  # T x B x C, as the graphs

    def _mean(self, x, mask):
        keep = (~mask).T[..., None]
        return (x * keep).sum(0) / np.maximum(keep.sum(0), 1)

    def layer(self, i, x, mask):
        self.calls.append((i, x.shape[1], x.shape[0]))
        x = np.tanh(x + self._mean(x, mask)[None] @ self.mix[i - 1]).astype(np.float32)
        x = x * (~mask).T[..., None]
        return x, (self._mean(x, mask) @ self.heads[i] if i in self.heads else None)

    def take(self, x, rows, length):
        return np.ascontiguousarray(x[:length, rows])

    def join(self, states, width):
        # padding filled with noise, not zeros: a row's answer must not depend on what its padding holds
        out = np.random.default_rng(len(states)).normal(size=(width, sum(x.shape[1] for x in states),
                                                              states[0].shape[2])).astype(np.float32)
        b = 0
        for x in states:
            out[: x.shape[0], b: b + x.shape[1]] = x
            b += x.shape[1]
        return out


def _inputs(n=24, seed=1):
    rng = np.random.default_rng(seed)
    return [list(rng.integers(2, 32, size=rng.integers(2, 12))) for _ in range(n)]


def _alone(backend, ids):
    """Every exit's logits (M, K) of one row run alone, all layers."""
    src = np.asarray([ids], dtype=np.int64)
    return loop.run_batch(backend, src, src == PAD).exit_logits[0]


def _run(backend, token_lists, request, batch_size):
    logits = np.zeros((len(token_lists), backend.num_classes), dtype=np.float32)
    layers = np.zeros(len(token_lists), dtype=np.int64)
    for rows, src in loop.make_batches(token_lists, batch_size, PAD):
        out = loop.run_batch(backend, src, src == PAD, request)
        logits[rows], layers[rows] = out.logits, out.exit_layer
    return logits, layers


def _median_at_first_exit(policy, per_exit):
    first = per_exit[:, 0]
    value = exits.prediction_entropy(first) if policy == "entropy" else loop.softmax(first).max(-1)
    return float(np.median(value))


@pytest.mark.parametrize("policy,threshold", [("entropy", None), ("confidence", None), ("patience", 1),
                                              ("patience", 2)])
def test_the_loop_exits_where_the_offline_policy_says(policy, threshold):
    """Each row leaves where ``exits.exit_layer_indices`` puts it from all its exits (run alone), with the logits
    of that exit, whoever shares its batches (batch 1 equals batched)."""
    backend, token_lists = MeanBackend(), _inputs()
    per_exit = np.stack([_alone(backend, ids) for ids in token_lists])  # (N, M, K)
    threshold = _median_at_first_exit(policy, per_exit) if threshold is None else threshold
    want = exits.exit_layer_indices(list(per_exit.transpose(1, 0, 2)), policy, threshold)
    request = loop.ExitRequest(policy, threshold)
    for batch_size in (1, 5, 24):
        logits, layers = _run(backend, token_lists, request, batch_size)
        assert layers.tolist() == [backend.exit_layers[m] for m in want], batch_size
        np.testing.assert_allclose(logits, per_exit[np.arange(len(want)), want], atol=1e-5, rtol=0)
    assert len(set(want.tolist())) > 1, "the threshold should spread the rows over the exits"


def test_exited_rows_leave_the_batch_and_padding_columns_are_cut():
    backend = MeanBackend()
    src = np.full((3, 9), PAD, dtype=np.int64)
    src[0, :9], src[1, :3], src[2, :2] = 5, 6, 7
    fire_first = loop.ExitRequest("confidence", 0.0)  # every row fires at its first exit
    out = loop.run_batch(backend, src, src == PAD, fire_first)
    assert out.exit_layer.tolist() == [1, 1, 1] and out.layers_computed.tolist() == [1, 1, 1]
    assert backend.calls == [(1, 3, 9)]
    backend.calls.clear()
    out = loop.run_batch(backend, src, src == PAD, loop.ExitRequest(exit_layer=2))
    assert out.exit_layer.tolist() == [2, 2, 2] and np.isnan(out.exit_logits[:, 2:]).all()
    assert backend.calls == [(1, 3, 9), (2, 3, 9)]  # no exit layer: nothing leaves, layer 3 never runs


def test_rows_that_stay_keep_only_the_columns_they_use():
    backend = MeanBackend(exit_layers=(1, 4))
    src = np.full((2, 8), PAD, dtype=np.int64)
    src[0, :8], src[1, :2] = 5, 6
    per_exit = loop.run_batch(backend, src, src == PAD).exit_logits
    top = exits.prediction_entropy(per_exit[:, 0])  # the long row leaves at layer 1, the short one stays
    threshold = float(top.mean())
    assert top[0] < threshold < top[1]
    backend.calls.clear()
    out = loop.run_batch(backend, src, src == PAD, loop.ExitRequest("entropy", threshold))
    assert out.exit_layer.tolist() == [1, 4]
    assert backend.calls == [(1, 2, 8), (2, 1, 2), (3, 1, 2), (4, 1, 2)]


def test_a_fixed_exit_layer_the_model_lacks_is_refused():
    backend = MeanBackend(exit_layers=(2, 4))
    src = np.asarray([[5, 6]])
    with pytest.raises(ValueError, match=r"exit layer 3 is not one of the model's exits \[2, 4\]"):
        loop.run_batch(backend, src, src == PAD, loop.ExitRequest(exit_layer=3))


# ---- the edge --------------------------------------------------------------------------------------------


