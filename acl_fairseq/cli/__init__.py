"""The command-line tools (``acl-evaluate``, ``acl-predict``, ``acl-help``) and what they share (logging and
device flags, reports, the recipe tables). Never imported at training time."""
