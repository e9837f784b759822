"""Evals during training: lm-evaluation-harness tasks and a held-out loss on the live model,
run only while the round pipeline would otherwise wait (docs/client.md, "Evals")."""
