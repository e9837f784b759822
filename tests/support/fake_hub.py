"""A stand-in for the Hugging Face Hub's upload API on loopback, for real client processes.

A client uploads a checkpoint with `huggingface_hub.HfApi.upload_folder`, which asks the Hub
how to send each file (`POST /api/models/REPO/preupload/REVISION`) and then commits them
(`POST /api/models/REPO/commit/REVISION`, newline-delimited JSON). This server answers both:
it tells the client to send every file inline ("regular", no LFS), keeps each commit's files
and answers with a commit id (the SHA-1 of the commit's body). Point a process at it with
`HF_ENDPOINT=hub.endpoint` (and any `HF_TOKEN`). Other requests get 404.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

API = "/api/models/"


@dataclass
class HubCommit:
    repo_id: str
    oid: str
    message: str
    files: dict[str, bytes] = field(default_factory=dict)


class FakeHub:
    def __init__(self) -> None:
        self.commits: list[HubCommit] = []
        self._lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                self._answer(404, {"error": "not served by the fake hub"})

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                answer = hub._handle(self.path, body)
                if answer is None:
                    self._answer(404, {"error": f"not served by the fake hub: {self.path}"})
                else:
                    self._answer(200, answer)

            def _answer(self, status: int, value: dict[str, object]) -> None:
                data = json.dumps(value).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _handle(self, path: str, body: bytes) -> dict[str, object] | None:
        if not path.startswith(API):
            return None
        repo_and_action = path.removeprefix(API)
        for action in ("/preupload/", "/commit/"):
            if action in repo_and_action:
                repo_id = repo_and_action.split(action)[0]
                break
        else:
            return None
        if action == "/preupload/":
            files = json.loads(body)["files"]
            return {
                "files": [
                    {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                    for f in files
                ]
            }
        commit = HubCommit(repo_id, hashlib.sha1(body).hexdigest(), "")
        for line in body.splitlines():
            entry = json.loads(line)
            value = entry["value"]
            if entry["key"] == "header":
                commit.message = value.get("summary", "")
            elif entry["key"] == "file":
                commit.files[value["path"]] = base64.b64decode(value["content"])
        with self._lock:
            self.commits.append(commit)
        return {
            "commitUrl": f"{self.endpoint}/{repo_id}/commit/{commit.oid}",
            "commitOid": commit.oid,
        }

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
