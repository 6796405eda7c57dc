"""The plugin's criteria, one per module (fairseq does not auto-import a user dir's criterions/)."""
# baselines first: this order registers them, and is the order `acl-help --list` prints
from . import sentence_ce, sentence_scl, acl_embed, acl_grad, acl_cross_layer, multi_exit_kd  # noqa: F401,I001
