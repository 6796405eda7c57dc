"""Full ``--help`` for the plugin's criteria and models.

fairseq-train's ``--help`` exits during its first parsing pass, before it adds the options of the
chosen ``--arch`` and ``--criterion``; so ``fairseq-train --user-dir acl_fairseq --criterion acl_grad
--help`` lists the criterion's name but not its flags. This prints the parser fairseq-train builds in
its second pass, with every plugin option and its help text:

    acl-help --criterion acl_cross_layer --arch multi_exit_roberta_base
    acl-help --list
"""
import argparse
import os
import sys
from typing import List

from acl_fairseq import criterions, models
from acl_runtime import console

PLUGIN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # acl_fairseq/, not acl_fairseq/cli/

def plugin_criteria() -> List[str]:
    """The criteria registered by ``acl_fairseq.criterions``, in registration (import) order."""
    from fairseq.criterions import CRITERION_REGISTRY

    return [name for name, cls in CRITERION_REGISTRY.items() if cls.__module__.startswith(criterions.__name__ + ".")]


def plugin_architectures() -> List[str]:
    """The architectures registered by ``acl_fairseq.models``, sorted."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    return sorted(name for name, cls in ARCH_MODEL_REGISTRY.items() if cls.__module__.startswith(models.__name__ + "."))


def build_parser(criterion: str, arch: str) -> argparse.ArgumentParser:
    """fairseq-train's parser with the model-, task- and criterion-specific options added."""
    from fairseq import options
    from fairseq.criterions import CRITERION_DATACLASS_REGISTRY
    from fairseq.dataclass.utils import gen_parser_from_dataclass
    from fairseq.models import ARCH_MODEL_REGISTRY
    from fairseq.tasks import TASK_REGISTRY

    parser = options.get_training_parser(default_task="sentence_prediction")
    model_group = parser.add_argument_group("Model-specific configuration", argument_default=argparse.SUPPRESS)
    ARCH_MODEL_REGISTRY[arch].add_args(model_group)
    TASK_REGISTRY["sentence_prediction_acl"].add_args(parser)  # the stock task's options + projector
    gen_parser_from_dataclass(parser, CRITERION_DATACLASS_REGISTRY[criterion]())
    return parser


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Print fairseq-train's full help for a plugin criterion and model.")
    p.add_argument("--criterion", default="acl_cross_layer", choices=plugin_criteria(),
                   help="criterion whose options to show")
    p.add_argument("--arch", default="multi_exit_roberta_base", help="architecture whose options to show")
    p.add_argument("--list", action="store_true", help="only list the plugin's criteria and architectures")
    a = p.parse_args(argv)
    sys.argv = [sys.argv[0], "--user-dir", PLUGIN_DIR]  # fairseq reads it
    from fairseq.models import ARCH_MODEL_REGISTRY

    if a.list:
        print("criteria:      " + " ".join(plugin_criteria()))
        print("architectures: " + " ".join(plugin_architectures()))
        return
    if a.arch not in ARCH_MODEL_REGISTRY:
        p.error(f"unknown --arch {a.arch}; see --list")
    build_parser(a.criterion, a.arch).print_help()


def cli_main() -> None:
    console.run("acl-help", main)


if __name__ == "__main__":
    cli_main()
