"""Two engines' early exits compared (torch against ONNX Runtime, one batching against another, one CPU kind
against another): the one rule every parity test that compares exit layers uses.

A row may exit at another layer, or take another label, on another engine only where its decision sits within
the numerics' reach of the threshold: its decision value (entropy, top probability, or for patience and labels
the top-two logit margin) closer to the threshold than the two engines' own measured difference in that value,
over every row and exit, times ``SLACK``. Every other row must agree exactly (exit and label) and its logits
to ``atol``. No count of allowed flips: a bound in rows held on one CPU kind and broke on another (an
AVX2-only CPU moves more rows within reach of a threshold; it also measures a larger difference)."""
import numpy as np

from acl_runtime import exits, loop

SLACK = 4.0  # the measured difference is a maximum over the rows seen; a flipped row may sit a little past it
FLOOR = 1e-7  # two engines that agree to the last bit still round the threshold's comparison


def decision_values(policy: str, per_exit: np.ndarray) -> np.ndarray:
    """(B, M): what the policy compares with its threshold at each exit; patience (and a label): the top-2 logit
    margin (a flip there needs a prediction that could go either way)."""
    flat = per_exit.reshape(-1, per_exit.shape[-1])
    if policy == "entropy":
        value = exits.prediction_entropy(flat)
    elif policy == "confidence":
        value = loop.softmax(flat).max(-1)
    else:
        top = np.sort(flat, axis=-1)
        value = top[:, -1] - top[:, -2]
    return np.asarray(value, dtype=np.float64).reshape(per_exit.shape[:2])


def flip_tolerance(policy: str, ref_all: np.ndarray, other_all: np.ndarray) -> float:
    """How far from the threshold a decision value may lie and still flip: the two engines' largest difference in
    that value over every row and exit (``ref_all``, ``other_all``: (B, M, K) every exit's logits from each, the
    same rows in the same batches), times SLACK."""
    measured = np.abs(decision_values(policy, ref_all) - decision_values(policy, other_all)).max()
    return float(SLACK * measured + FLOOR)


def assert_same_exits(policy, threshold, ref_all, other_all, ref_out, other_out, atol):
    """``ref_out``, ``other_out``: (logits (B, K), exit layers (B,)) of each engine under ``policy`` and
    ``threshold`` (None: the last exit). Equal exits and labels, logits to ``atol``, but for the rows within
    :func:`flip_tolerance` of the decision; returns those rows' indices."""
    (r_logits, r_layers), (o_logits, o_layers) = ref_out, other_out
    label_tol = flip_tolerance(None, ref_all, other_all)
    margins = decision_values(None, ref_all)
    if policy:
        tol = flip_tolerance(policy, ref_all, other_all)
        target = 0.0 if policy == "patience" else threshold
        gaps = np.abs(decision_values(policy, ref_all) - target).min(1)
    flips = []
    for i in range(len(r_layers)):
        if r_layers[i] == o_layers[i] and r_logits[i].argmax() == o_logits[i].argmax():
            np.testing.assert_allclose(o_logits[i], r_logits[i], atol=atol, rtol=0, err_msg=f"example {i}")
            continue
        if r_layers[i] == o_layers[i] or policy is None:  # another label at the same exit: a near tie of logits
            assert margins[i].min() < label_tol, f"example {i}: labels differ with a margin of {margins[i].min()}"
        else:
            assert gaps[i] < tol, (f"example {i}: exit {r_layers[i]} vs {o_layers[i]}, decision value {gaps[i]} from "
                                   f"the threshold, beyond the engines' measured reach {tol}")
        flips.append(i)
    return flips


def all_exits(predictor, token_lists, batch_size: int) -> np.ndarray:
    """(B, M, K) every exit's logits of ``predictor`` (the torch hub or the ONNX Runtime engine: both are
    ``acl_runtime.loop.EarlyExitPredictor``s), in input order, batched as a policy's run would be."""
    batches = list(predictor.make_batches(token_lists, batch_size))
    return np.stack([np.asarray(predictor.run_batches(batches, len(token_lists), exit_layer=k)[0], dtype=np.float32)
                     for k in predictor.exit_layers], 1)
