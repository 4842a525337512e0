# Pool, features (gradients per checkpoint and shard, curvature, hidden states, embeddings)
# and per-method scoring. (Filled in by the attribution work.)


def all_scores():
    """Every per-method, per-model score artifact the analysis grades."""
    return []
