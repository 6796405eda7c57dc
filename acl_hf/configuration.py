"""The multi-exit classifier's configuration: its own ``model_type`` with the encoder's configuration nested, as
``EncoderDecoderConfig`` nests its encoder's (rebuilt through ``CONFIG_MAPPING`` on load)."""
from huggingface_hub.dataclasses import strict
from transformers import AutoConfig, PreTrainedConfig
from transformers.configuration_utils import SubConfigSpec

from acl_torch.exit_heads import POOLING_MODES
from acl_torch.losses import EXIT_WEIGHTINGS

MODEL_TYPE = "acl-multi-exit"
DEFAULT_HEAD_NAME = "sentence_classification_head"  # fairseq's --classification-head-name default
# encoders whose hidden states between layers are the raw residual stream (pre-LayerNorm): a norm per shallow exit
PRE_LN_ENCODERS = ("modernbert",)


@strict
class MultiExitConfig(PreTrainedConfig):
    """A classification head after each of ``exit_layers`` (1-based; None: every layer) of ``encoder``.

    ``exit_pooling``: what each head reads ("cls": the first token's state, "mean": the mean of the non-padding
    states). ``head_activation``/``head_dropout``: None takes them from the encoder's configuration (see
    :func:`acl_hf.modeling.head_defaults`). ``exit_weighting``: how the exits' losses are weighted ("layer":
    proportional to the layer, PABEE; "uniform"). ``head_name``: the fairseq head name the heads are named after,
    so that a checkpoint converts between the two trainers.
    """

    model_type = MODEL_TYPE
    sub_configs_defaults = {"encoder": SubConfigSpec(config_class=AutoConfig, model_type="bert")}

    encoder: PreTrainedConfig | dict | None = None
    exit_layers: list[int] | None = None
    exit_pooling: str = "cls"
    head_activation: str | None = None
    head_dropout: float | int | None = None
    exit_weighting: str = "layer"
    head_name: str = DEFAULT_HEAD_NAME
    use_cache: bool = True  # the Trainer turns it off while it trains: declared, so that it round-trips

    def to_dict(self):
        """As every config's, the nested encoder's dtype written as the model's (``from_pretrained`` sets it on
        both), so that a saved folder reloads and saves again to the same ``config.json``."""
        out = super().to_dict()
        encoder = out.get("encoder")
        if isinstance(encoder, dict) and encoder.get("dtype") is None and out.get("dtype") is not None:
            encoder["dtype"] = out["dtype"]
        return out

    def validate_exits(self):
        """One line for an exit layer outside the encoder, or an unknown pooling or weighting."""
        if self.exit_pooling not in POOLING_MODES:
            raise ValueError(f"exit_pooling must be one of {POOLING_MODES}, got {self.exit_pooling!r}")
        if self.exit_weighting not in EXIT_WEIGHTINGS:
            raise ValueError(f"exit_weighting must be one of {EXIT_WEIGHTINGS}, got {self.exit_weighting!r}")
        layers = self.exit_layers
        n = self.num_encoder_layers
        if layers is not None and (not layers or sorted(set(layers)) != list(layers) or layers[0] < 1
                                   or layers[-1] > n):
            raise ValueError(f"exit_layers must be increasing 1-based layers in 1..{n} (the encoder's layers), "
                             f"got {layers}")

    @property
    def num_encoder_layers(self) -> int:
        return int(self.encoder.num_hidden_layers)

    @property
    def layers(self) -> list:
        """The 1-based layer behind each exit."""
        return list(self.exit_layers) if self.exit_layers else list(range(1, self.num_encoder_layers + 1))

    @property
    def pre_ln(self) -> bool:
        return self.encoder.model_type in PRE_LN_ENCODERS
