"""The benches' studies and simulations (not part of any production package; tests may import
them, they import nothing from tests/).

- `simulation`: in-process DisTrO peers and an AdamW baseline on a tiny byte-level Llama (the
  convergence test and `bench/distro.py`, `bench/verification.py`); `distro_study` (the
  300-step study of variants) builds on it.
- The optimizer study of issue 22 (`bench/distro.py --study`): `study_protocol` (what is run),
  `study_runs` (one run), `study_frontier` (rows, frontier and bests, pure), `study_runner`
  (the stages, cached and in parallel), `study_report` (a saved study as markdown tables:
  `python -m bench.study.study_report FILE`).
- `coordinator_sim`: a whole run of the coordinator on a fake clock with simulated clients;
  `verification_sim` adds verifiers to it (`bench/convictions.py`).
"""
