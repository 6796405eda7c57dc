"""The plugin's optimizers (``--optimizer adamw_torch``); fairseq does not auto-import a user dir's optim/."""
from . import adamw_torch  # noqa: F401
