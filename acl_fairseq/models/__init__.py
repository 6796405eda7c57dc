"""Models of the plugin. fairseq also imports every module here by itself when it loads the user dir,
under the same dotted name (``acl_fairseq.models.<module>``), so nothing registers twice."""

from . import multi_exit_roberta  # noqa: F401
