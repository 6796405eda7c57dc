"""The plugin's tasks. fairseq also imports every module here by itself when it loads the user dir,
under the same dotted name (``acl_fairseq.tasks.<module>``), so nothing registers twice."""
from . import sentence_prediction_acl  # noqa: F401
