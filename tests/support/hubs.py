"""A stand-in for the Hugging Face Hub on loopback, for ``asrpool fetch-model``.

A fake, and only because the real Hub cannot be reached from here: it answers the
three requests ``huggingface_hub`` makes to download a repo (repo info with the file
list, then HEAD and GET of ``/{repo}/resolve/{revision}/{file}``) for repos made of the
files of a folder, with the Hub's own error codes for an unknown repo or file, and it
counts file downloads. The client, its cache and its locks are the real ones.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class Hub:
    def __init__(self, repos: dict[str, Path], host: str = "127.0.0.1") -> None:
        """``host``: the address to listen on (loopback, or a bridge the tests made)."""
        self.repos = repos
        self.downloads: list[str] = []  # "repo/file" per GET of a file's content
        self._server = http.server.ThreadingHTTPServer((host, 0), self._handler())
        self.url = f"http://{host}:{self._server.server_address[1]}"

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *_: object) -> None:
                pass

            def do_HEAD(self) -> None:
                hub.answer(self, body=False)

            def do_GET(self) -> None:
                hub.answer(self, body=True)

        return Handler

    def answer(self, request: http.server.BaseHTTPRequestHandler, *, body: bool) -> None:
        parts = urllib.parse.unquote(urllib.parse.urlsplit(request.path).path).strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            self._info(request, "/".join(parts[2:4]))
        elif len(parts) >= 5 and parts[2] == "resolve":
            self._file(request, "/".join(parts[:2]), "/".join(parts[4:]), body=body)
        else:
            self._error(request, 404, "RepoNotFound")

    def _info(self, request: http.server.BaseHTTPRequestHandler, repo: str) -> None:
        folder = self.repos.get(repo)
        if folder is None:
            self._error(request, 404, "RepoNotFound")
            return
        siblings = [{"rfilename": path.name} for path in sorted(folder.iterdir())]
        self._send(request, 200, json.dumps({"id": repo, "sha": COMMIT,
                                             "siblings": siblings}).encode(), {})

    def _file(self, request: http.server.BaseHTTPRequestHandler, repo: str, name: str, *,
              body: bool) -> None:
        folder = self.repos.get(repo)
        if folder is None:
            self._error(request, 404, "RepoNotFound")
            return
        path = folder / name
        if not path.is_file():
            self._error(request, 404, "EntryNotFound")
            return
        content = path.read_bytes()
        headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha256(content).hexdigest()}"'}
        if body:
            self.downloads.append(f"{repo}/{name}")
        self._send(request, 200, content if body else b"", headers, length=len(content))

    def _error(self, request: http.server.BaseHTTPRequestHandler, status: int, code: str) -> None:
        self._send(request, status, b"{}", {"X-Error-Code": code, "X-Repo-Commit": COMMIT})

    @staticmethod
    def _send(request: http.server.BaseHTTPRequestHandler, status: int, content: bytes,
              headers: dict[str, str], length: int | None = None) -> None:
        request.send_response(status)
        for key, value in headers.items():
            request.send_header(key, value)
        request.send_header("Content-Length", str(len(content) if length is None else length))
        request.end_headers()
        if content:
            request.wfile.write(content)

    @contextmanager
    def running(self) -> Iterator[Hub]:
        thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()
            thread.join(5)
