"""A network lab: hosts in Linux network namespaces on a bridge "switch", clients behind their
own NAT router, per-host egress rate limits and link cuts (root only; the netlab tests of
tests/netlab and `bench/netlab.py` use it).

- `plan`: pure naming and addressing (unique names per lab, a private 10.213.x.x range).
- `shell`: running `ip`/`iptables`/`tc` and whether namespaces can be made here.
- `lab.Lab`: builds a topology, runs commands and processes inside it, always tears down.
- `cluster.LabCluster`: a server and clients run in the lab's hosts.
"""
