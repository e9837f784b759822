"""Training backends: the torch trainer, the DisTrO backend around it, a dummy backend for
tests, and device selection."""
