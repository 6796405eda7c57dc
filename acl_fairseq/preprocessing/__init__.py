"""GLUE preprocessing for fairseq's ``sentence_prediction`` task: ``acl-preprocess`` (the console script)
or ``python preprocess/glue.py`` (the same ``main``, started by path from a checkout).

Modules: ``glue`` (the command line and the pipeline), ``glue_tasks`` (the per-task table and the strict TSV
reader), ``glue_tokenizers`` (the run's tokenizer files and its dict.txt), ``text_encoders`` (the tokenizing
process pool and the dict.txt of each tokenizer; the tokenizers are ``acl_runtime.tokenization``),
``gpt2_files`` (fetching or locally building GPT-2 BPE files), ``glue_binarize`` (fairseq-preprocess calls and
stats). The SCL paper's few-shot split and label noise are ``acl_runtime.scl_protocols`` (acl-train-hf draws the
same splits).

Not imported by ``acl_fairseq/__init__.py``: ``fairseq-train --user-dir acl_fairseq`` never loads it.
"""
