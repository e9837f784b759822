"""The study's Markdown tables come from its JSON: picked learning rates in bold, diagnostics
last, goals with their verdicts."""

from __future__ import annotations

import json
from pathlib import Path

from bench.study.study_report import markdown

REPORT = {
    "sweep": {
        "adamw": {"lr": 0.004, "at_edge": False, "losses": {"0.002": 1.7, "0.004": 1.6}},
        "sparseloco": {"lr": 0.008, "at_edge": True, "losses": {"0.004": 2.1, "0.008": 2.0}},
        "diloco": {"outer_lr": 0.3, "at_edge": False, "losses": {"0.1": 2.5, "0.3": 2.2}},
    },
    "frontier": [
        {
            "name": "diloco-p4",
            "bytes_ratio": 5.0,
            "loss_vs_adamw_mean": 1.1,
            "seeds": [1.1, 1.1],
            "seed_max_above_mean": 0.0,
            "tokens_to_target_ratio": 0.5,
            "diagnostic": True,
        },
        {
            "name": "sparseloco-p4",
            "bytes_ratio": 650.6,
            "loss_vs_adamw_mean": 1.25,
            "seeds": [1.24, 1.26],
            "seed_max_above_mean": 0.01,
            "tokens_to_target_ratio": None,
            "diagnostic": False,
        },
    ],
    "goals": [
        {"min_bytes_ratio": 600.0, "max_loss_vs_adamw": 1.08, "best": "sparseloco-p4", "met": False}
    ],
}


def test_tables_show_the_measured_figures() -> None:
    text = markdown(REPORT)
    assert "| candidate | lr 0.002 | lr 0.004 | lr 0.008 | lr 0.1 | lr 0.3 | picked |" in text
    assert "| adamw | 1.7000 | **1.6000** | – | – | – | 0.004 |" in text
    assert "| sparseloco | – | 2.1000 | **2.0000** | – | – | 0.008, at the edge |" in text
    assert "| diloco (outer lr) | – | – | – | 2.5000 | **2.2000** | 0.3 |" in text
    rows = [line for line in text.splitlines() if line.startswith("| sparseloco-p4")]
    assert rows == ["| sparseloco-p4 | 651 | 1.250 (1.240, 1.260) | 0.010 | – |"]
    assert text.index("| sparseloco-p4") < text.index("| diagnostic: diloco-p4 | 5 |")
    assert "best `sparseloco-p4`, not met." in text


def test_the_docs_tables_are_the_saved_study_rendered() -> None:
    """docs/distro.md carries the tables of docs/optimizer-study.json, nothing else."""
    root = Path(__file__).resolve().parents[2]
    report = json.loads((root / "docs" / "optimizer-study.json").read_text())
    docs = (root / "docs" / "distro.md").read_text()
    for table in markdown(report).split("\n\n"):
        assert table in docs
    assert report["best_at_146"] and report["best_at_600"]
