"""Tiny lm-eval multiple-choice tasks written to a folder, reading their documents from a local
JSON-lines file (`dataset_path: json`): what a user does with downloaded task data, and what the
eval tests run (no Hub access)."""

from __future__ import annotations

import json
from pathlib import Path

DOCS = (
    {"question": "1 + 1 =", "choices": ["2", "7", "x"], "answer": 0},
    {"question": "def f(x): return", "choices": [" x", " }", " ;;"], "answer": 0},
    {"question": "import", "choices": [" os", " 9", " ("], "answer": 0},
    {"question": "class A:", "choices": [" pass", " 3", " ]"], "answer": 0},
    {"question": "for i in", "choices": [" range(3):", " }}", " 7"], "answer": 0},
)

TASK_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
fewshot_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
  - metric: acc_norm
"""


def write_tasks(folder: Path, names: tuple[str, ...] = ("tiny_mc",)) -> Path:
    """`folder` with one task YAML per name (all reading the same `DOCS`); returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "tiny_mc.jsonl"
    data.write_text("".join(json.dumps(doc) + "\n" for doc in DOCS))
    for name in names:
        (folder / f"{name}.yaml").write_text(TASK_YAML.format(name=name, data=data))
    return folder
