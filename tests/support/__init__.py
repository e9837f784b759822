"""Test and benchmark support code that is not part of any production package; the helpers
that more than one test module uses live here (pytest fixtures stay in the `conftest.py`
files; the e2e and netlab suites keep the process harnesses only they use).

Fakes and builders:
- `fakes`: the round pipeline's ports in memory (`MemoryHub`/`MemoryNetwork` for
  `PeerNetwork`, `RecordingUplink` for `Uplink`) and an unsigned result announcement.
- `coordinators`: real `Coordinator`s (`coordinator_in` brings one to a run state, step,
  epoch and membership by real transitions), configs, ids and real witnesses.
- `rounds`: client round states (`observer_round`, `downloaded`).
- `runners`: `lone_runner`, a `RoundRunner` on the dummy backend with no peers.

Harnesses and simulations:
- `client_harness`: N round runners against a fake server and a real coordinator.
- `server_harness` and `protocol_client`: a real server in-process and a protocol client.
- `p2p`: small P2P helpers (a dead address, a polling wait, a `Finished` announcement).
- `tiny_distro`: a tiny net and DisTrO results for the DisTrO unit tests.

The studies and simulations the benches run (and some tests check) live in `bench/study`, and
what the benches build their runs from in `bench/support` (`coordinators` takes its configs
from `bench.support.run_configs`): `bench/` imports nothing from `tests/`.
"""
