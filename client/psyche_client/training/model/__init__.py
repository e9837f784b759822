"""The model as a file and a value: loading (local / builtin preset / Hub), which source a
repo id names, parameter export, safetensors checkpoints written atomically, builtin presets."""
