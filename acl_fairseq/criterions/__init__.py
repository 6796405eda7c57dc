"""The plugin's criteria, one per module (fairseq does not auto-import a user dir's criterions/)."""
from . import acl_cross_layer, acl_embed, acl_grad, sentence_ce, sentence_scl  # noqa: F401
