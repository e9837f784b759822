"""The client's model over its life: loading it (Hub / builtin / peers), the Warmup weights
check, sharing and saving it at Cooldown (`lifecycle.ModelLifecycle`)."""
