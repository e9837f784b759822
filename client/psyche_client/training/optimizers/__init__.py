"""Optimizer variants behind one interface: `base` (the `TrainingOptimizer` protocol the
trainer drives, `OptimizerSpec`), one module per variant (`distro`, `sparseloco`, `adamw`)
and `registry` (the variants by name)."""
