# Licensed under the MIT license.
"""Multi-exit RoBERTa: one fairseq ``RobertaClassificationHead`` after each chosen encoder layer.

A thin subclass of fairseq's ``RobertaModel`` (encoder, embeddings and transformer layers are
fairseq's own). Registered as ``multi_exit_roberta`` with presets ``multi_exit_roberta_base`` and
``multi_exit_roberta_large``. Example:
``fairseq-train DATA --user-dir acl_fairseq --task sentence_prediction --arch multi_exit_roberta_base
--exit-layers 2,4,6,8,10,12 --exit-pooling cls --criterion sentence_prediction ...``

Heads: ``register_classification_head(name, ...)`` (what the ``sentence_prediction`` task calls)
registers one head per exit, ``f"{name}_exit{layer}"`` for every exit but the last, and the last
exit's head under ``name`` itself, so stock tools (the ``sentence_prediction`` criterion, hub
``predict``) see the final exit as an ordinary RoBERTa head. A plain ``roberta`` checkpoint restores
into this model (``--restore-file model.pt --reset-optimizer ...``): fairseq's
``upgrade_state_dict_named`` copies heads missing from the checkpoint from their fresh weights, and
this model logs which heads that was. ``MultiExitRobertaModel.from_pretrained(run_dir, "checkpoint_best.pt",
data_bin)`` gives the plugin's hub interface (:mod:`acl_fairseq.inference.hub`), whose ``predict`` pools as the model
was trained and whose ``predict_early_exit`` takes raw text.
"""

import logging
import re
from typing import List, Optional

import torch
from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta.model import (
    RobertaModel,
    roberta_base_architecture,
    roberta_large_architecture,
)
from fairseq.utils import safe_getattr
from omegaconf import OmegaConf

from acl_fairseq import checkpoint_safety
from acl_runtime import conventions
from acl_torch.exit_heads import POOLING_MODES, ExitOutputs, head_forward, pool_states

logger = logging.getLogger(__name__)

_EXIT_HEAD_RE = re.compile(r"_exit\d+$")


def parse_exit_layers(spec: Optional[str], num_layers: int) -> List[int]:
    """``"1,3"`` -> ``[1, 3]`` (1-based, increasing); None or "" -> every layer ``1..num_layers``."""
    if spec is None or str(spec).strip() == "":
        return list(range(1, num_layers + 1))
    try:
        layers = sorted({int(s) for s in str(spec).split(",") if s.strip()})
    except ValueError:
        raise ValueError(f"--exit-layers must be a comma-separated list of integers, got {spec!r}") from None
    if not layers or layers[0] < 1 or layers[-1] > num_layers:
        raise ValueError(f"--exit-layers {spec!r} must lie in 1..{num_layers} (--encoder-layers)")
    return layers


@register_model("multi_exit_roberta")
class MultiExitRobertaModel(RobertaModel):
    def __init__(self, args, encoder):
        super().__init__(args, encoder)
        self.exit_layers = parse_exit_layers(args.exit_layers, args.encoder_layers)
        self.exit_pooling = args.exit_pooling
        if self.exit_pooling not in POOLING_MODES:  # checked once here, not on every pool_states call
            raise ValueError(f"--exit-pooling must be one of {POOLING_MODES}, got {self.exit_pooling!r}")
        if safe_getattr(args, "encoder_layerdrop", 0.0) > 0:
            # LayerDrop skips layers in training, so inner_states would no longer line up with layers
            raise ValueError("multi_exit_roberta does not support --encoder-layerdrop > 0")
        eps = safe_getattr(args, "layer_norm_eps", None)
        if eps is not None:  # an encoder trained elsewhere with its own epsilon (BERT's 1e-12): fairseq's is 1e-5
            for module in self.encoder.modules():
                if isinstance(module, torch.nn.LayerNorm):
                    module.eps = float(eps)
        self.conventions = conventions.from_args(args)
        if self.conventions is not None and self.conventions["segment_embedding"]:
            # BERT's token type 1 minus type 0 (type 0 is folded into the positions): see conventions.py.
            # A hook on the token embedding reaches every path that embeds tokens (forward, hub,
            # the layer-by-layer early-exit engine), so none can drop the segment.
            self.segment_delta = torch.nn.Parameter(torch.zeros(args.encoder_embed_dim))
            self.encoder.sentence_encoder.embed_tokens.register_forward_hook(self._add_segment)

    def _add_segment(self, module, inputs, embedded):
        encoder = self.encoder.sentence_encoder
        mask = conventions.segment_mask(inputs[0], encoder.dictionary.eos(), encoder.padding_idx)
        return embedded + mask.unsqueeze(-1).to(embedded.dtype) * self.segment_delta.to(embedded.dtype)

    @staticmethod
    def add_args(parser):
        RobertaModel.add_args(parser)
        parser.add_argument(
            "--exit-layers",
            type=str,
            metavar="L1,L2,...",
            help="comma-separated 1-based encoder layers that get an exit (classification head); "
            "the last one listed is the final exit. Default: every layer",
        )
        parser.add_argument(
            "--exit-pooling",
            choices=POOLING_MODES,
            help="what each exit head reads: 'cls' = the layer's <s> state (fairseq's convention), "
            "'mean' = the mean of the layer's non-padding states. Default: cls",
        )
        parser.add_argument(
            "--conventions",
            type=str,
            metavar="PATH",
            help="conventions.json of a converted encoder (acl-convert-hf writes it beside model.pt), "
            "or its folder: pair format (sets the task's separator token), BERT's segment embedding, head "
            "dropout (the default of --pooler-dropout), tokenizer. The record itself is kept in the "
            "checkpoint. Default: none (RoBERTa, fairseq's behaviour)",
        )
        parser.add_argument(
            "--layer-norm-eps",
            type=float,
            metavar="EPS",
            help="epsilon of every LayerNorm of the encoder, for an encoder trained with another than fairseq's "
            "(acl-export of a Hugging Face BERT, 1e-12). Default: fairseq's 1e-5",
        )

    @classmethod
    def build_model(cls, args, task):
        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, False)  # RobertaModel.build_model sets it back
        multi_exit_roberta_architecture(args)  # the exit options exist whatever the cfg came from
        conventions.apply_to_task(conventions.from_args(args), task)
        # every checkpoint names its training dictionary, whatever the task (see checkpoint_safety.py)
        before = checkpoint_safety.record_dictionary(args, getattr(getattr(task, "cfg", None), "data", None))
        model = super().build_model(args, task)
        setattr(model, checkpoint_safety.DICTIONARY_BUILT_FROM, before)
        return model

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        has_segment = "segment_delta" in state_dict
        if has_segment != hasattr(self, "segment_delta"):
            where = "the checkpoint has BERT's segment embedding but this model was built without it" if has_segment \
                else "this model has a segment embedding (--conventions) but the checkpoint has none"
            raise conventions.ConventionsError(
                f"{where}: pass --conventions DIR/conventions.json of the converted encoder (acl-convert-hf) "
                "so that both agree"
            )
        return super().load_state_dict(state_dict, strict, model_cfg, args)

    @classmethod
    def from_pretrained(cls, model_name_or_path, checkpoint_file="checkpoint_best.pt", data_name_or_path=".",
                        **kwargs):
        """A :class:`acl_fairseq.inference.hub.MultiExitHubInterface` (raw text in, labels and exit layers out); the
        tokenizer comes from the data folder's record, so no tokenizer arguments are needed. (fairseq's
        ``RobertaModel.from_pretrained`` needs ``user_dir=`` the acl_fairseq folder for this arch, else it fails
        with ``KeyError: "'no_progress_bar'"``.)"""
        from acl_fairseq.inference import hub

        return hub.from_pretrained(model_name_or_path, checkpoint_file, data_name_or_path, **kwargs)

    # ---- heads ---------------------------------------------------------------------------------

    def exit_head_names(self, name: str) -> List[str]:
        """Head names of the exits in layer order; the last (final) exit is ``name`` itself."""
        return [f"{name}_exit{layer}" for layer in self.exit_layers[:-1]] + [name]

    def register_classification_head(self, name, num_classes=None, inner_dim=None, **kwargs):
        """Register one head per exit (see the module docstring for the names).

        A name that is already a per-exit name (``..._exitN``, e.g. a head found in a checkpoint
        when loading with ``load_checkpoint_heads``) registers that single head only.
        """
        names = [name] if _EXIT_HEAD_RE.search(name) else self.exit_head_names(name)
        for head_name in names:
            super().register_classification_head(head_name, num_classes, inner_dim, **kwargs)

    def upgrade_state_dict_named(self, state_dict, name):
        """fairseq's upgrade (which copies heads missing from the checkpoint from their current,
        freshly initialised weights), plus one log line naming those heads."""
        prefix = name + "." if name != "" else ""
        in_checkpoint = {
            k[len(prefix + "classification_heads.") :].split(".")[0]
            for k in state_dict
            if k.startswith(prefix + "classification_heads.")
        }
        fresh = [h for h in self.classification_heads.keys() if h not in in_checkpoint]
        super().upgrade_state_dict_named(state_dict, name)
        if fresh:
            logger.info(
                "multi_exit_roberta: %d classification head(s) not in the checkpoint, newly initialised: %s",
                len(fresh),
                ", ".join(fresh),
            )

    # ---- forward -------------------------------------------------------------------------------

    def forward(
        self,
        src_tokens,
        features_only=False,
        return_all_hiddens=False,
        classification_head_name=None,
        **kwargs,
    ):
        """Without a head name: exactly ``RobertaModel.forward``. With one: ``(logits of the last
        exit (B, K), extra)``, where ``extra["exits"]`` is an :class:`ExitOutputs` over every exit
        and ``extra["inner_states"]`` holds the per-layer states (list of T x B x C; None when the
        only exit is on the top layer and ``return_all_hiddens`` is not asked for)."""
        if classification_head_name is None:
            return super().forward(src_tokens, features_only, return_all_hiddens, **kwargs)
        # the per-layer states are kept only when an exit reads one (a single top exit reads the output)
        inner = return_all_hiddens or self.exit_layers[0] < len(self.encoder.sentence_encoder.layers)
        features, extra = self.encoder(src_tokens, features_only=True, return_all_hiddens=inner, **kwargs)
        extra["exits"] = self.exit_outputs(src_tokens, features, extra["inner_states"], classification_head_name)
        return extra["exits"].logits[-1], extra

    def exit_outputs(self, src_tokens, features, inner_states, name) -> ExitOutputs:
        """Run every exit head on its layer. features: B x T x C (encoder output); inner_states:
        list of num_layers + 1 tensors T x B x C (embeddings first), or None when only the top layer exits."""
        padding_mask = src_tokens.eq(self.encoder.sentence_encoder.padding_idx)
        num_layers = len(self.encoder.sentence_encoder.layers)
        out = ExitOutputs([], [], [], [], [])
        for layer, head_name in zip(self.exit_layers, self.exit_head_names(name)):
            # the last layer reads the encoder output (it includes a pre-norm encoder's final LayerNorm)
            # T x B x C -> B x T x C
            states = features if layer == num_layers else inner_states[layer].transpose(0, 1)
            head = self.classification_heads[head_name]
            pooled = pool_states(states, padding_mask, self.exit_pooling)
            logits, u = head_forward(head, pooled)
            out.logits.append(logits)
            out.features.append(u)
            out.pooled.append(pooled)
            out.label_embeddings.append(head.out_proj.weight)
            out.layers.append(layer)
        return out


@register_model_architecture("multi_exit_roberta", "multi_exit_roberta")
def multi_exit_roberta_architecture(args):
    args.conventions = conventions.resolve(safe_getattr(args, "conventions", None))  # the record, as JSON text
    record = conventions.from_args(args)
    if record is not None and record["head_dropout"] is not None:
        args.pooler_dropout = safe_getattr(args, "pooler_dropout", record["head_dropout"])
    args.exit_layers = safe_getattr(args, "exit_layers", None)  # None: an exit after every layer
    args.exit_pooling = safe_getattr(args, "exit_pooling", "cls")  # fairseq's <s> convention
    args.layer_norm_eps = safe_getattr(args, "layer_norm_eps", None)  # None: fairseq's LayerNorm default
    roberta_base_architecture(args)


@register_model_architecture("multi_exit_roberta", "multi_exit_roberta_base")
def multi_exit_roberta_base_architecture(args):
    multi_exit_roberta_architecture(args)  # 12 layers, 768 dim: the shapes of roberta.base


@register_model_architecture("multi_exit_roberta", "multi_exit_roberta_large")
def multi_exit_roberta_large_architecture(args):
    roberta_large_architecture(args)  # 24 layers, 1024 dim, fills the encoder shape first
    multi_exit_roberta_architecture(args)
