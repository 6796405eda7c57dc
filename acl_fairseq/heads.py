"""How the plugin's criteria read a fairseq classifier with one or several exits, as :class:`ExitOutputs`.

Every criterion in this plugin reads the model through :func:`collect_exit_outputs`, which
returns :class:`ExitOutputs` for both a multi-exit RoBERTa (which returns them itself, in
``extra["exits"]``) and a stock single-exit ``roberta_*`` model (where the head's inputs are
captured with forward pre-hooks during the one ordinary ``model(...)`` call, so DDP wrappers and
their hooks see a normal forward).

Notation follows METHOD.md: ``u^m`` is the input of exit m's ``out_proj`` (after the head's second
dropout), ``W_c^m = out_proj.weight`` holds the label embeddings, ``c^m`` is the pooled state the
head reads.
"""
from contextlib import contextmanager
from typing import Dict

import torch
from torch import Tensor, nn

# the shape and the exits' maths live with the rest of the torch maths; these names are re-exported for the plugin
from acl_torch.exit_heads import ExitOutputs


@contextmanager
def _capture_head_inputs(head: nn.Module):
    """Record a stock head's <s> state (B, C) and its out_proj's input (B, d) during one forward.

    The head slices row 0 of its input itself, so a slice taken here would not be on CE's path, and
    gradients with respect to it (ACL-Grad's ``features`` scope) would see no CE at all. The head is handed
    its input rebuilt from the recorded row instead: the same values, with that row on CE's path."""
    seen: Dict[str, Tensor] = {}

    def route_pooled(_module, args):
        states = args[0]  # B x T x C
        seen["pooled"] = states[:, 0, :]
        return (torch.cat([seen["pooled"].unsqueeze(1), states[:, 1:, :]], dim=1),) + tuple(args[1:])

    def grab_u(_module, args):
        seen["u"] = args[0]

    handles = [
        head.register_forward_pre_hook(route_pooled),
        head.out_proj.register_forward_pre_hook(grab_u),
    ]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def collect_exit_outputs(model: nn.Module, net_input: Dict, head_name: str) -> ExitOutputs:
    """One forward pass of ``model``; returns every exit's logits and representations.

    Works for the plugin's ``multi_exit_roberta`` (M exits) and for stock ``roberta_*`` (M = 1).
    """
    heads = model.classification_heads
    if head_name not in heads:
        raise ValueError(
            f"model lacks the classification head {head_name!r} (has {sorted(heads.keys())}); "
            "use --task sentence_prediction with the same --classification-head-name"
        )
    head = heads[head_name]
    with _capture_head_inputs(head) as seen:
        logits, extra = model(**net_input, features_only=True, classification_head_name=head_name)
    if isinstance(extra, dict) and extra.get("exits") is not None:
        return extra["exits"]
    num_layers = len(model.encoder.sentence_encoder.layers)
    return ExitOutputs(
        logits=[logits],
        features=[seen["u"]],
        pooled=[seen["pooled"]],
        label_embeddings=[head.out_proj.weight],
        layers=[num_layers],
    )

