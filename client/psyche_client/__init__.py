"""The training client: PyTorch trainer, DisTrO, peer-to-peer exchange, dashboard."""
