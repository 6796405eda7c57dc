"""Tiny random encoders of every architecture the Hugging Face path supports (docs/hf_trainer.md's table), a
multi-exit model over each, and a toy batch set in their id space. Sizes are small and odd (hidden 24, 3 layers,
ffn 37) so that a step takes milliseconds."""
import torch
import transformers

VOCAB = 120
SIZES = dict(hidden_size=24, num_hidden_layers=3, num_attention_heads=2, intermediate_size=37,
             max_position_embeddings=64, vocab_size=VOCAB)
DROPOUT_OFF = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def encoder_config(name: str):
    """A tiny random configuration of ``name`` (a transformers model_type)."""
    if name == "bert":
        return transformers.BertConfig(**SIZES, **DROPOUT_OFF)
    if name == "roberta":
        return transformers.RobertaConfig(**SIZES, **DROPOUT_OFF, pad_token_id=1)
    if name == "xlm-roberta":
        return transformers.XLMRobertaConfig(**SIZES, **DROPOUT_OFF, pad_token_id=1)
    if name == "electra":
        return transformers.ElectraConfig(**SIZES, **DROPOUT_OFF, embedding_size=16)
    if name == "distilbert":
        return transformers.DistilBertConfig(vocab_size=VOCAB, dim=24, n_layers=3, n_heads=2, hidden_dim=37,
                                             max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
                                             seq_classif_dropout=0.0)
    if name == "deberta-v2":
        return transformers.DebertaV2Config(**SIZES, **DROPOUT_OFF, pooler_dropout=0.0, relative_attention=True,
                                            position_buckets=8, pos_att_type=["p2c", "c2p"])
    if name == "modernbert":
        return transformers.ModernBertConfig(vocab_size=VOCAB, hidden_size=24, num_hidden_layers=3,
                                             num_attention_heads=2, intermediate_size=37, max_position_embeddings=64,
                                             pad_token_id=0, bos_token_id=2, eos_token_id=3, cls_token_id=2,
                                             sep_token_id=3, global_attn_every_n_layers=2, local_attention=8,
                                             attention_dropout=0.0, mlp_dropout=0.0, embedding_dropout=0.0)
    raise ValueError(name)


ENCODERS = ("bert", "roberta", "xlm-roberta", "electra", "distilbert", "deberta-v2", "modernbert")


def multi_exit(name: str = "bert", num_labels: int = 2, seed: int = 0, **config_kw):
    import acl_hf

    torch.manual_seed(seed)
    config = acl_hf.MultiExitConfig(encoder=encoder_config(name).to_dict(), num_labels=num_labels, **config_kw)
    return acl_hf.MultiExitForSequenceClassification(config)


class ToySet(torch.utils.data.Dataset):
    """``n`` examples of random ids (3 .. VOCAB), right-padded to 9, the label readable from the first token."""

    def __init__(self, n: int = 32, num_labels: int = 2, seed: int = 0, width: int = 9):
        gen = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(n):
            length = int(torch.randint(4, width + 1, (1,), generator=gen))
            ids = torch.randint(3, VOCAB, (width,), generator=gen)
            mask = (torch.arange(width) < length).long()
            ids = torch.where(mask.bool(), ids, torch.zeros_like(ids))
            ids[0] = 2
            label = int(ids[1]) % num_labels
            self.rows.append({"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids),
                              "labels": torch.tensor(label)})

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]
