"""Where a client's metrics go (docs/operations.md, "Metrics with wandb"): the sink protocol
and its no-op (`sink`), the options of `--wandb-*` (`options`), the values of one step
(`step_values`, pure), the part that emits each finished step (`reporter`), the Weights &
Biases sink (`wandb_sink`) and the factory the app's `Parts` uses (`factory`)."""
