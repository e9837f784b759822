"""Helpers only `psyche-client check` uses: memory and traffic estimates of a run."""
