"""``MultiExitForSequenceClassification``: a classification head after every chosen layer of any ``AutoModel``
encoder (docs/hf_trainer.md has the table of encoders).

The heads are fairseq's ``RobertaClassificationHead`` in shape, name and initialisation (``dense``, an activation,
``dropout`` twice, ``out_proj``; torch's default ``nn.Linear`` initialisation, as fairseq registers them), stored
as ``classification_heads.{head_name}_exit{L}`` for every exit but the last and ``classification_heads.{head_name}``
for the last, the names of the plugin's ``multi_exit_roberta``: a checkpoint's heads convert by name. The encoder
has no pooler (an unused pooler breaks DDP). A pre-LayerNorm encoder (ModernBERT) gets a LayerNorm per shallow
exit, its between-layer states being the raw residual stream; every encoder's last layer is read after its own
final norm.

``forward`` returns the exit-weighted task loss (CE, or MSE with one label) as a batch mean, so the plain
``Trainer`` and ``pipeline`` work; ``acl_hf.trainer.AclTrainer`` asks for the exits' features
(``output_exit_features=True``) and computes the criterion itself (:mod:`acl_torch.objective`). At inference
:meth:`MultiExitForSequenceClassification.predict_early_exit` stops the encoder for a batch once every row has
left by a policy of ``acl_runtime.exits``' table.
"""
import inspect
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
from torch import nn
from transformers import AutoModel, PreTrainedModel
from transformers.activations import ACT2FN
from transformers.utils import ModelOutput

from acl_runtime import exits as policies
from acl_torch import losses, objective
from acl_torch.exit_heads import ExitOutputs, head_forward, pool_states

from .configuration import MultiExitConfig

ENCODER_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "position_ids", "inputs_embeds")


def head_defaults(encoder_config) -> Tuple[str, float]:
    """The heads' activation and dropout as the encoder's own classifier has them: DeBERTa's pooler and ModernBERT's
    head use GELU, the others tanh (BERT's pooler, RoBERTa's head: fairseq's); the dropout is the classifier's
    where the encoder names one, else its hidden dropout."""
    named = [getattr(encoder_config, key, None) for key in ("pooler_hidden_act", "classifier_activation")]
    activation = next((a for a in named if isinstance(a, str)), "tanh")  # MobileBERT's classifier_activation: a bool
    for key in ("classifier_dropout", "seq_classif_dropout", "pooler_dropout", "hidden_dropout_prob", "dropout"):
        value = getattr(encoder_config, key, None)
        if value is not None:
            return activation, float(value)
    return activation, 0.1


class ExitHead(nn.Module):
    """fairseq's ``RobertaClassificationHead``: dropout, dense, activation, dropout, out_proj (read by
    :func:`acl_torch.exit_heads.head_forward`)."""

    def __init__(self, hidden: int, num_labels: int, activation: str, dropout: float):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.activation_fn = ACT2FN[activation]
        self.dropout = nn.Dropout(dropout)
        self.out_proj = nn.Linear(hidden, num_labels)

    def forward(self, pooled: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return head_forward(self, pooled)


@dataclass
class MultiExitOutput(ModelOutput):
    """``loss`` (with labels: the exit-weighted task loss, a batch mean), ``logits`` (the last exit's, or each row's
    exit's under :meth:`~MultiExitForSequenceClassification.predict_early_exit`), ``exit_logits`` (every exit's, in
    layer order), and with ``output_exit_features=True`` each exit's ``u`` (``exit_features``) and pooled state
    (``exit_pooled``); ``exit_layer``: the 1-based layer each row left at (early exit only)."""

    loss: Optional[torch.Tensor] = None
    logits: Optional[torch.Tensor] = None
    exit_logits: Optional[Tuple[torch.Tensor, ...]] = None
    exit_features: Optional[Tuple[torch.Tensor, ...]] = None
    exit_pooled: Optional[Tuple[torch.Tensor, ...]] = None
    exit_layer: Optional[torch.Tensor] = None


class MultiExitPreTrainedModel(PreTrainedModel):
    config_class = MultiExitConfig
    config: MultiExitConfig
    base_model_prefix = "encoder"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    accepts_loss_kwargs = False  # forward takes a plain batch mean; AclTrainer normalises its own sum

    def _init_weights(self, module):
        """Only this model's own modules: the heads as torch initialises an ``nn.Linear`` (fairseq's heads), the
        exit norms to the identity; the encoder initialises itself (and loaded tensors are skipped)."""
        from transformers import initialization as init

        if isinstance(module, ExitHead):
            for linear in (module.dense, module.out_proj):
                init.kaiming_uniform_(linear.weight, a=5 ** 0.5)
                bound = 1 / linear.in_features ** 0.5
                init.uniform_(linear.bias, -bound, bound)
        elif isinstance(module, nn.LayerNorm) and module in set(getattr(self, "exit_norms", {}).values()):
            init.ones_(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif hasattr(self, "encoder") and any(module is m for m in self.encoder.modules()):
            self.encoder._init_weights(module)


class MultiExitForSequenceClassification(MultiExitPreTrainedModel):
    keys_to_ignore_at_inference = ["exit_features", "exit_pooled"]

    def __init__(self, config: MultiExitConfig):
        super().__init__(config)
        config.validate_exits()
        self.encoder = AutoModel.from_config(config.encoder)
        if getattr(self.encoder, "pooler", None) is not None:
            self.encoder.pooler = None  # unused: the heads pool for themselves
        self._encoder_inputs = set(inspect.signature(self.encoder.forward).parameters) & set(ENCODER_INPUTS)
        self.num_labels = config.num_labels
        self.layers = config.layers
        hidden = config.encoder.hidden_size
        activation, dropout = head_defaults(config.encoder)
        activation = config.head_activation or activation
        dropout = dropout if config.head_dropout is None else float(config.head_dropout)
        self.classification_heads = nn.ModuleDict({
            name: ExitHead(hidden, config.num_labels, activation, dropout) for name in self.head_names()})
        last = config.num_encoder_layers
        self.exit_norms = nn.ModuleDict({
            str(layer): nn.LayerNorm(hidden, eps=getattr(config.encoder, "norm_eps", 1e-5),
                                     bias=getattr(config.encoder, "norm_bias", True))
            for layer in self.layers if config.pre_ln and layer < last})
        self.post_init()

    def head_names(self) -> List[str]:
        """The heads' names in layer order, the plugin's: ``{name}_exit{L}``, the last exit ``{name}``."""
        name = self.config.head_name
        return [f"{name}_exit{layer}" for layer in self.layers[:-1]] + [name]

    @classmethod
    def from_encoder_pretrained(cls, encoder_name_or_path: str, num_labels: int, **config_kwargs):
        """A pretrained encoder (any ``AutoModel`` folder) with fresh exit heads, as ``EncoderDecoderModel``'s
        ``from_encoder_decoder_pretrained``; ``config_kwargs`` are :class:`MultiExitConfig`'s."""
        encoder = AutoModel.from_pretrained(encoder_name_or_path)
        config = MultiExitConfig(encoder=encoder.config.to_dict(), num_labels=num_labels, **config_kwargs)
        model = cls(config)
        missing, unexpected = model.encoder.load_state_dict(encoder.state_dict(), strict=False)
        if missing:
            raise ValueError(f"{encoder_name_or_path}: the encoder lacks {sorted(missing)[:5]}")
        final_norm = getattr(model.encoder, "final_norm", None)
        with torch.no_grad():
            for norm in model.exit_norms.values():  # a pre-LN exit starts from the encoder's own final norm
                norm.load_state_dict(final_norm.state_dict())
        return model

    # ---- forward -----------------------------------------------------------------------------

    def _encoder_kwargs(self, kwargs) -> dict:
        """The inputs this encoder's ``forward`` takes (DistilBERT and ModernBERT have no ``token_type_ids``)."""
        return {k: v for k, v in kwargs.items() if k in self._encoder_inputs and v is not None}

    def _padding_mask(self, input_ids, attention_mask, inputs_embeds) -> torch.Tensor:
        if attention_mask is not None:
            return attention_mask == 0
        ref = input_ids if input_ids is not None else inputs_embeds[..., 0]
        return torch.zeros(ref.shape[:2], dtype=torch.bool, device=ref.device)

    def _exit(self, i: int, layer: int, states: torch.Tensor, padding_mask: torch.Tensor):
        """Exit i (1-based ``layer``) on its layer's states: ``(logits, u, pooled)``."""
        if str(layer) in self.exit_norms:
            states = self.exit_norms[str(layer)](states)
        pooled = pool_states(states, padding_mask, self.config.exit_pooling)
        logits, u = self.classification_heads[self.head_names()[i]](pooled)
        return logits, u, pooled

    def forward(
        self,
        input_ids: Optional[torch.Tensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        token_type_ids: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.Tensor] = None,
        inputs_embeds: Optional[torch.Tensor] = None,
        labels: Optional[torch.Tensor] = None,
        output_exit_features: bool = False,
        return_dict: Optional[bool] = None,
    ) -> MultiExitOutput:
        encoded = self.encoder(**self._encoder_kwargs(dict(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
            position_ids=position_ids, inputs_embeds=inputs_embeds)), output_hidden_states=True, return_dict=True)
        padding_mask = self._padding_mask(input_ids, attention_mask, inputs_embeds)
        top = self.config.num_encoder_layers
        outs = [self._exit(i, layer, encoded.last_hidden_state if layer == top else encoded.hidden_states[layer],
                           padding_mask) for i, layer in enumerate(self.layers)]
        exit_logits = tuple(o[0] for o in outs)
        loss = None
        if labels is not None:
            loss = self.exit_weighted_loss(exit_logits, labels)
        return MultiExitOutput(
            loss=loss, logits=exit_logits[-1], exit_logits=exit_logits,
            exit_features=tuple(o[1] for o in outs) if output_exit_features else None,
            exit_pooled=tuple(o[2] for o in outs) if output_exit_features else None)

    @property
    def regression(self) -> bool:
        return self.num_labels == 1

    def exit_weighted_loss(self, exit_logits, labels) -> torch.Tensor:
        """The exit-weighted task loss over the batch, a mean (what the plain Trainer back-propagates)."""
        weights = losses.exit_weights(self.layers, self.config.exit_weighting).to(labels.device)
        total = losses.weighted_exit_sum(
            [objective.task_loss(z, labels.view(-1), self.regression) for z in exit_logits], weights)
        return total / max(labels.numel(), 1)

    def exit_outputs(self, output: MultiExitOutput) -> ExitOutputs:
        """A forward's output (with ``output_exit_features=True``) in the shape the objective reads."""
        return ExitOutputs(logits=list(output.exit_logits), features=list(output.exit_features),
                           pooled=list(output.exit_pooled),
                           label_embeddings=[self.classification_heads[n].out_proj.weight for n in self.head_names()],
                           layers=list(self.layers))

    # ---- early exit at inference ----------------------------------------------------------------

    @torch.no_grad()
    def predict_early_exit(self, policy: str = "entropy", threshold: Optional[float] = None,
                           **inputs) -> MultiExitOutput:
        """Each row's prediction at the first exit whose ``policy`` (a row of ``acl_runtime.exits.POLICIES``) fires,
        the last exit where none does; the encoder stops once every row of the batch has left. ``logits``: each
        row's exit's; ``exit_layer``: its 1-based layer; ``exit_logits``: the exits that ran."""
        threshold = policies.validate(policy, threshold, regression=self.regression)
        kwargs = self._encoder_kwargs(inputs)
        padding_mask = self._padding_mask(inputs.get("input_ids"), inputs.get("attention_mask"),
                                          inputs.get("inputs_embeds"))
        batch = padding_mask.shape[0]
        run = _EarlyExitRun(policy, threshold, batch, padding_mask, self)
        blocks = _layer_blocks(self.encoder, self.config.num_encoder_layers)
        handles = [blocks[layer - 1].register_forward_hook(run.hook(i, layer))
                   for i, layer in enumerate(self.layers[:-1])]
        try:
            encoded = self.encoder(**kwargs, return_dict=True)
            run.last(encoded.last_hidden_state)
        except _AllExited:
            pass
        finally:
            for h in handles:
                h.remove()
        return MultiExitOutput(logits=run.chosen, exit_logits=tuple(run.exit_logits), exit_layer=run.layer)


class _AllExited(Exception):
    """Raised from a layer's hook once every row of the batch has left: the encoder stops there."""


class _EarlyExitRun:
    def __init__(self, policy, threshold, batch, padding_mask, model):
        self.policy, self.threshold, self.padding_mask, self.model = policy, threshold, padding_mask, model
        self.state = policies.init_state(batch, device=padding_mask.device)
        self.decided = torch.zeros(batch, dtype=torch.bool, device=padding_mask.device)
        self.layer = torch.full((batch,), model.layers[-1], dtype=torch.long, device=padding_mask.device)
        self.chosen: Optional[torch.Tensor] = None
        self.exit_logits: List[torch.Tensor] = []

    def take(self, logits: torch.Tensor, layer: int, fire: torch.Tensor) -> None:
        new = fire & ~self.decided
        self.chosen = logits.clone() if self.chosen is None else torch.where(new[:, None], logits, self.chosen)
        self.layer = torch.where(new, torch.full_like(self.layer, layer), self.layer)
        self.decided |= fire
        self.exit_logits.append(logits)

    def hook(self, i: int, layer: int):
        def after_layer(_module, _args, output):
            states = output[0] if isinstance(output, (tuple, list)) else output
            logits = self.model._exit(i, layer, states, self.padding_mask)[0]
            fire, self.state = policies.policy_step(self.policy, logits, self.state, self.threshold,
                                                    regression=self.model.regression)
            self.take(logits, layer, fire)
            if bool(self.decided.all()):
                raise _AllExited
        return after_layer

    def last(self, states: torch.Tensor) -> None:
        logits = self.model._exit(len(self.model.layers) - 1, self.model.layers[-1], states, self.padding_mask)[0]
        self.take(logits, self.model.layers[-1], torch.ones_like(self.decided))


def _layer_blocks(encoder: nn.Module, num_layers: int) -> nn.ModuleList:
    """The encoder's list of transformer layers (``encoder.layer``, ``transformer.layer``, ``layers``, ...)."""
    found = [m for m in encoder.modules() if isinstance(m, nn.ModuleList) and len(m) == num_layers]
    if not found:
        raise ValueError(f"{type(encoder).__name__}: no list of {num_layers} layers to exit early from")
    return found[0]
