"""A run over slow links (real server and client processes in the network lab).

Every client's link is shaped with `tc tbf` to 5 Mbit/s up and 10 Mbit/s down, and its
results are as large as the `builtin:llama-20m` preset's DisTrO results under the run's
compression settings (dummy training with `--dummy-result-size`, computed from the model's
real result layout). Rounds must complete within the round time: nobody is dropped or
accused, every client applies every client's results, the weights hashes agree at every
step, and no client finds its link too slow. A late joiner then fetches the model from its
peers over its limited downlink, while they cap their model-share uploads with
`--max-upload-mbps`: the download takes at least as long as the caps allow.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest

from bench.harness.client_run import Proc, applied_hashes, wait_for, write_state
from bench.harness.netlab.cluster import LabCluster
from bench.harness.netlab.lab import Lab

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

UP_MBIT = 5.0
DOWN_MBIT = 10.0
SHARE_CAP_MBIT = 2.0
"""Each member's --max-upload-mbps: the joiner gets at most 3 x 2 Mbit/s, under its
10 Mbit/s downlink."""
MODEL_BYTES = 6_000_000
"""The dummy model's shared size (the real preset's 40 MB bf16 would make the test long)."""


def llama20m_result_size(chunk: int = 64, topk: int = 8, one_bit: bool = True) -> int:
    """Bytes of every DisTrO result of `builtin:llama-20m` with the lab state's compression
    settings (those of bench.harness.client_run.STATE_TEMPLATE)."""
    import torch
    from psyche_client.distro.result import ResultLayout, ValueKind
    from psyche_client.distro.size import encoded_result_size
    from psyche_client.training.model.loading import builtin_config, config_from_dict
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config_from_dict(builtin_config("llama-20m")))
    shapes = [(name, tuple(p.shape)) for name, p in model.named_parameters()]
    kind = ValueKind.ONE_BIT if one_bit else ValueKind.BF16
    return encoded_result_size(ResultLayout.for_parameters(shapes, chunk, topk, kind))


def test_rounds_complete_over_slow_links_and_a_late_joiner_gets_the_model(
    netlab: Lab, tmp_path: Path
) -> None:
    result_size = llama20m_result_size()
    assert 50_000 < result_size < 100_000  # docs/distro.md: 63,386 bytes
    state = write_state(
        tmp_path / "state.toml",
        total_steps=32,
        warmup_time=15,
        epoch_time=20,
        max_round_train_time=3,
        init_min_clients=3,
        min_clients=3,
        witness_nodes=0,  # every client witnesses: a Warmup waits for the joiner's download
        batch=8,
    )
    netlab.add_host("srv")
    names = ["c1", "c2", "c3", "late"]
    for name in names:
        netlab.add_host(name)
        netlab.limit_egress(name, UP_MBIT)
        netlab.limit_ingress(name, DOWN_MBIT)
    c = LabCluster(netlab, tmp_path, state)
    c.start_server("srv")
    sized = ["--dummy-result-size", str(result_size), "--dummy-model-size", str(MODEL_BYTES)]
    cap = ["--max-upload-mbps", str(SHARE_CAP_MBIT)]
    first = [c.start_client(name, *sized, *cap) for name in names[:3]]
    wait_for(lambda: len(applied_hashes(first[0])) >= 2, 150, "the first epoch", c.diagnostics)
    joiner = c.start_client("late", *sized)
    clients = [*first, joiner]
    wait_for(
        lambda: all(p.popen.poll() is not None for p in clients),
        330,
        "the run to finish",
        c.diagnostics,
    )
    assert [p.popen.returncode for p in clients] == [0] * len(clients), c.diagnostics()
    assert c.server is not None
    assert not [m for m in messages(c.server) if m.startswith("health check from")]

    # the late joiner got the model from its peers, as fast as their upload caps allow
    (fetched,) = joiner.events("model fetched peer-to-peer")
    assert fetched["bytes"] >= MODEL_BYTES
    (started,) = [
        e
        for e in joiner.lines()
        if str(e.get("msg", "")).startswith("fetching the model from")
        and "peer(s)" in str(e.get("msg"))
    ]
    seconds = timestamp(fetched) - timestamp(started)
    floor = MODEL_BYTES * 8 / (3 * SHARE_CAP_MBIT * 1e6)  # 8 s; 4.8 s at the joiner's downlink
    assert seconds >= 0.9 * floor, seconds
    joined = applied_hashes(joiner)
    assert len(joined) >= 3, c.diagnostics()
    # the model it fetched is the one the others held at the end of the first epoch
    before = max(step for step in applied_hashes(first[0]) if step < min(joined))
    assert fetched["weights_hash"] == applied_hashes(first[0])[before]

    # clients of each epoch: every one of them applies every step of it
    members = Counter(
        epoch for p in clients for epoch in {e["epoch"] for e in p.events("applied step")}
    )
    for proc in clients:
        assert not [m for m in messages(proc) if "health check" in m], (proc.name, c.diagnostics())
        assert not [m for m in messages(proc) if "too slow" in m], proc.name
        assert not errors_while_running(proc), proc.name
        applied = proc.events("applied step")
        # every client's results at every step but an epoch's first (which applies the
        # Warmup's, none): nobody missed the round time
        epochs = {e["epoch"] for e in applied}
        firsts = {min(e["step"] for e in applied if e["epoch"] == x) for x in epochs}
        partial = [
            (e["step"], e["results"])
            for e in applied
            if e["step"] not in firsts and e["results"] != members[e["epoch"]]
        ]
        assert not partial, (proc.name, partial)
        assert proc is joiner or len(applied) >= 6, (proc.name, c.diagnostics())
    tables = [applied_hashes(p) for p in clients]
    for step in set().union(*tables):
        values = {table[step] for table in tables if step in table}
        assert len(values) == 1, f"step {step}: {tables}"
    for proc in first:
        assert set(joined) <= set(applied_hashes(proc)), proc.name


def errors_while_running(proc: Proc) -> list[str]:
    """ERROR records before the client's "run finished" (tearing down its event loop then,
    Python 3.11's asyncio logs its cancelled connection handlers as errors)."""
    errors = []
    for line in proc.lines():
        if line.get("msg") == "run finished; exiting":
            break
        if line.get("level") == "ERROR":
            errors.append(str(line.get("msg", "")))
    return errors


def timestamp(line: dict[str, object]) -> float:
    return datetime.fromisoformat(str(line["ts"])).timestamp()


def messages(proc: Proc) -> list[str]:
    return [str(line.get("msg", "")) for line in proc.lines()]


SLOW_DOWN_MBIT = 0.2


def test_a_client_whose_link_is_too_slow_for_the_round_time_says_so(
    netlab: Lab, tmp_path: Path
) -> None:
    """One client's downlink is shaped to 0.2 Mbit/s: the round's other two results
    (2 x 63 KB, about 1 Mbit) take 5 s there, more than the 3 s round time. That client warns,
    naming a measured rate no faster than its shaping and the rate the run needs. (Its peers
    may warn too: the acknowledgements of its own uploads crawl over that downlink, so its
    results reach them slowly as well; the run cannot keep its round time either way.)"""
    result_size = llama20m_result_size()
    state = write_state(
        tmp_path / "state.toml",
        total_steps=40,
        max_round_train_time=3,
        init_min_clients=3,
        min_clients=2,
        witness_nodes=2,
    )
    netlab.add_host("srv")
    for name in ("fast1", "fast2", "slow"):
        netlab.add_host(name)
        netlab.limit_egress(name, UP_MBIT)
        netlab.limit_ingress(name, SLOW_DOWN_MBIT if name == "slow" else DOWN_MBIT)
    c = LabCluster(netlab, tmp_path, state)
    c.start_server("srv")
    sized = ["--dummy-result-size", str(result_size)]
    for name in ("fast1", "fast2"):
        c.start_client(name, *sized)
    slow = c.start_client("slow", *sized)

    def warnings(proc: Proc) -> list[dict[str, object]]:
        return [line for line in proc.lines() if "too slow for this run" in str(line.get("msg"))]

    wait_for(lambda: warnings(slow), 150, "the slow client's warning", c.diagnostics)
    warning = warnings(slow)[0]
    assert warning["level"] == "WARNING"
    assert float(str(warning["link_mbps"])) <= SLOW_DOWN_MBIT * 1.05, warning
    assert float(str(warning["results_seconds"])) > 3.0, warning
    assert warning["round_time"] == 3.0
    # what the run needs: the round's results (whole results of this run's size) in 3 s
    needed = re.search(r"the round's (\d+) results \((\d+) bytes\)", str(warning["msg"]))
    assert needed is not None, warning["msg"]
    count, size = int(needed[1]), int(needed[2])
    assert 1 <= count <= 2 and size == count * result_size, warning["msg"]
    assert float(str(warning["needed_mbps"])) == round(size * 8 / 3 / 1e6, 3), warning
    assert f"needs at least {size * 8 / 3 / 1e6:.2f} Mbit/s down" in str(warning["msg"])
