"""Hugging Face interchange: ``acl-convert-hf`` (a BERT or RoBERTa folder into a fairseq checkpoint) and the
parameter mapping it follows. Never imported at training time."""
