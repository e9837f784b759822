"""Statistical verification of trainers' DisTrO results by recomputed gradients."""
