"""Hugging Face's side: acl-convert-hf (HF encoders into fairseq), acl-export --format hf, a converted model in
fairseq-train, and training parity with Hugging Face update by update. Tiny random HF models: tests/tiny_hf.py."""
