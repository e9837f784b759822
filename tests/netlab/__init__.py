"""A network lab for tests: hosts in Linux network namespaces on a bridge "switch", clients
behind their own NAT router, per-host egress rate limits and link cuts (test-only code).

- `plan`: pure naming and addressing (unique names per lab, a private 10.213.x.x range).
- `shell`: running `ip`/`iptables`/`tc` and whether namespaces can be made here.
- `lab.Lab`: builds a topology, runs commands and processes inside it, always tears down.
- `fixtures`: the `netlab` pytest fixture (skips with a reason where namespaces cannot be made).
"""
