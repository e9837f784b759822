"""Test and benchmark support code that is not part of any production package.

`simulation`: in-process DisTrO peers and an AdamW baseline on a tiny byte-level Llama (used by
the convergence test and `bench/distro.py`).
"""
