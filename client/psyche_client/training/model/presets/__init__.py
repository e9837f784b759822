"""Built-in model presets (`builtin:NAME`): Hugging Face config.json files, one per preset.

Loaded by `psyche_client.training.model.loading`; weights are built from the config with a deterministic seed.
"""
