"""Real processes and networks the benches run and the e2e and netlab tests share (tests may
import them; they import nothing from tests/).

- `client_run`: a `psyche-server` and `psyche-client` processes on loopback (`Proc`,
  `Cluster`, `write_state`), their JSON logs read back.
- `attack_run`: one attacked or clean run of real processes, measured alike for the attack
  tests and `bench/attacks.py` (its attackers are the test-only programs of tests/e2e, run by
  path), with the hosts it may add: `flood` (idle sockets), `hostile_hosts` (decode bombs,
  relay exhaustion, forged weights hashes, through `protocol_client`), `tamper_proxy` (a man
  in the middle flipping a byte).
- `netlab`: the network lab (Linux network namespaces, a bridge, NAT routers: `lab`, `plan`,
  `shell`) and a cluster of processes in it (`cluster`).
"""
