"""GLUE's metrics for the plugin's criteria and tools: :mod:`acl_torch.glue_metrics`, the home both trainers read."""
from acl_torch.glue_metrics import (  # noqa: F401
    POSITIVE_LABELS,
    classification_metrics,
    f1_from_counts,
    label_names,
    mcc_from_counts,
    pearson_from_sums,
    positive_index,
    regression_metrics,
)
