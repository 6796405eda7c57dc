"""acl_fairseq: Aligned Contrastive Learning and SCL criteria plus a multi-exit RoBERTa for fairseq.

Load it in fairseq with ``--user-dir acl_fairseq`` (or ``--user-dir $(python -c 'import acl_fairseq, os;
print(os.path.dirname(acl_fairseq.__file__))')`` once installed). torch and fairseq are not listed as
install requirements on purpose: see README "Set-up" for the order they must be installed in.
"""
from setuptools import find_packages, setup

# pip install .[serve]: what acl-predict OUT/onnx and acl-serve need, without torch or fairseq. Pinned as
# requirements.txt pins them, and numpy as scripts/setup_env.sh does (tests/serve/test_serving_install.py checks
# that they agree; scripts/check_serving_env.sh installs exactly these)
SERVE_REQUIRES = ["numpy==1.26.4", "onnxruntime==1.30.0", "tokenizers==0.23.3", "starlette==1.10.0",
                  "uvicorn==0.54.0", "prometheus-client==0.26.0", "msgspec==0.23.0"]

# pip install .[hf]: the Hugging Face Trainer path (acl_hf, acl-train-hf) over CPU or CUDA torch installed first,
# without fairseq (scripts/check_hf_env.sh builds it fresh). Pinned as requirements.txt pins them.
HF_REQUIRES = ["transformers==5.24.0", "safetensors==0.8.0", "tokenizers==0.23.3", "accelerate==1.15.0",
               "numpy==1.26.4", "scipy==1.17.1"]

setup(
    name="acl_fairseq",
    version="0.1.0",
    description="ACL (aligned contrastive learning) and SCL fine-tuning criteria and a multi-exit RoBERTa for fairseq",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.8",
    # the torch-free runtime (acl_runtime: acl-predict on OUT/onnx, acl-serve), the torch maths both trainers call
    # (acl_torch), and the two trainers over it: the fairseq plugin and the Hugging Face path (acl_hf)
    packages=find_packages(include=["acl_runtime", "acl_runtime.*", "acl_torch", "acl_torch.*", "acl_fairseq",
                                    "acl_fairseq.*", "acl_hf", "acl_hf.*"]),
    # the GLUE task table (recipes/glue/hparams.tsv is a link to it)
    package_data={"acl_runtime": ["glue_tasks.tsv"]},
    install_requires=["numpy", "sentencepiece", "tensorboardX", "tokenizers"],
    extras_require={"serve": SERVE_REQUIRES, "hf": HF_REQUIRES},
    entry_points={
        "console_scripts": [
            "acl-evaluate=acl_fairseq.cli.evaluate:cli_main",
            "acl-predict=acl_runtime.predict:cli_main",
            "acl-serve=acl_runtime.serve.cli:cli_main",
            "acl-convert-hf=acl_fairseq.hf.convert:cli_main",
            "acl-export=acl_fairseq.hf.export:cli_main",
            "acl-preprocess=acl_fairseq.preprocessing.glue:cli_main",
            "acl-help=acl_fairseq.cli.help:cli_main",
            "acl-tune=acl_fairseq.cli.tune:cli_main",
            "acl-train-hf=acl_hf.train:cli_main",
        ],
        # how acl-predict (acl_runtime, torch-free) reaches a fairseq checkpoint without importing the plugin
        "acl_runtime.checkpoint_reader": ["fairseq=acl_fairseq.inference.checkpoint_reader"],
    },
    license="MIT",
)
