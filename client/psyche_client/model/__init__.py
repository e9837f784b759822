"""The model as a file and a value: loading (local / builtin preset / Hub), parameter export,
safetensors checkpoints, sharing at Cooldown and memory estimates."""
