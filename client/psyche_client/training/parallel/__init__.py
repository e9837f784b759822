"""Multi-device clients on torch.distributed: one client identity over several local ranks
(data parallelism over full replicas, or a model sharded with `fully_shard`). Rank 0 is the
client process and exposes `ParallelBackend`; the other ranks run `worker`."""
