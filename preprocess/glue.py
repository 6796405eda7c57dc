#!/usr/bin/env python
"""Preprocess one GLUE task (official TSV folder) into fairseq binarized data for ``--task sentence_prediction``.

    python preprocess/glue.py --task RTE --input glue_data/RTE --output RTE-bin --tokenizer gpt2 --bpe-dir gpt2_bpe

The entry point of a checkout; the installed console script ``acl-preprocess`` is the same command. The
code, the per-task table and the output layout are in ``acl_fairseq/preprocessing/`` (``glue.py``).
"""
from acl_fairseq.preprocessing.glue import cli_main

if __name__ == "__main__":
    cli_main()
