"""What the benches build their runs from, shared with the tests (which may import it; it
imports nothing from tests/): `run_configs` (a small run's `[config]` and `[model.LLM]`
tables, a DisTrO run's model, a coordinator waiting for members), `models` (model directories
the benches write, e.g. the ~134M Llama), `eval_tasks` (tiny lm-eval tasks in a folder).
"""
