"""setup_logging: JSON lines carry ts/level/logger/msg and the `extra` fields."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

from psyche_common.logs import setup_logging


def test_json_lines_with_extra(tmp_path: Path) -> None:
    stream = io.StringIO()
    setup_logging("json", "debug", stream=stream)
    logging.getLogger("psyche.test").info("step %d", 3, extra={"client": b"\xab\xcd", "loss": 1.5})
    entry = json.loads(stream.getvalue().strip())
    assert entry["level"] == "INFO" and entry["logger"] == "psyche.test"
    assert entry["msg"] == "step 3" and entry["client"] == "abcd" and entry["loss"] == 1.5
    assert entry["ts"].endswith("+00:00")

    log_file = tmp_path / "logs" / "server.log"
    setup_logging("console", logging.WARNING, file=log_file)
    logging.getLogger("psyche.test").info("hidden")
    logging.getLogger("psyche.test").warning("shown", extra={"peer": "ab"})
    text = log_file.read_text()
    assert "hidden" not in text and "shown peer=ab" in text
    assert stream.getvalue().count("\n") == 1  # the first handler was replaced
    setup_logging("console", "info")
