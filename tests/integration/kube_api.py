"""A small stand-in for the Kubernetes API server on 127.0.0.1, for the client-side path.

No API server can run on this machine (no kube-apiserver package, no container runtime), so this
serves the REST paths hpcpipe uses, from memory: create/get/replace/delete of ConfigMaps and
custom objects, pod lists by label selector, pod logs. The code under test is real: kubeconfig
loading, the ``kubernetes`` client, its HTTP requests and their bearer token.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

_COLLECTION = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[a-z]+)(?:/(?P<name>[^/]+))?(?P<log>/log)?$"
)


class KubeApi:
    """Objects by (plural, namespace, name); pods and their logs are seeded by the test."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.pod_logs: dict[str, str] = {}
        self.tokens: list[str] = []
        self.requests: list[tuple[str, str]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> KubeApi:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def write_kubeconfig(self, path: Path, token: str) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local", "cluster": {"server": self.url}}],
            "users": [{"name": "trainer", "user": {"token": token}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": "trainer"}}],
            "current-context": "local",
        }
        path.write_text(json.dumps(config))
        return path

    def add_pod(self, namespace: str, name: str, labels: dict[str, str], log: str) -> None:
        self.objects[("pods", namespace, name)] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"nodeName": "gpu-node-1", "containers": [{"name": "node", "image": "x"}]},
            "status": {
                "phase": "Running",
                "containerStatuses": [
                    {
                        "name": "node",
                        "restartCount": 1,
                        "ready": True,
                        "image": "x",
                        "imageID": "",
                        "started": True,
                    }
                ],
            },
        }
        self.pod_logs[name] = log

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet test output
                pass

            def _route(self) -> tuple[re.Match[str] | None, dict[str, list[str]]]:
                url = urlparse(self.path)
                api.requests.append((self.command, url.path))
                api.tokens.append(self.headers.get("Authorization", ""))
                return _COLLECTION.match(url.path), parse_qs(url.query)

            def _send(self, code: int, body: Any, text: bool = False) -> None:
                data = body.encode() if text else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain" if text else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _status(self, code: int, reason: str, message: str) -> None:
                self._send(
                    code,
                    {
                        "kind": "Status",
                        "status": "Failure",
                        "reason": reason,
                        "message": message,
                        "code": code,
                    },
                )

            def _body(self) -> dict[str, Any]:
                return json.loads(self.rfile.read(int(self.headers["Content-Length"])))

            def do_POST(self) -> None:
                match, _ = self._route()
                if match is None:
                    return self._status(404, "NotFound", self.path)
                body = self._body()
                key = (match["plural"], match["ns"] or "", body["metadata"]["name"])
                if key in api.objects:
                    return self._status(409, "AlreadyExists", f'{key[0]} "{key[2]}" already exists')
                body["metadata"]["resourceVersion"] = "1"
                body["metadata"]["uid"] = str(uuid.uuid4())
                api.objects[key] = body
                self._send(201, body)

            def do_PUT(self) -> None:
                match, _ = self._route()
                assert match is not None
                body = self._body()
                api.objects[(match["plural"], match["ns"] or "", match["name"])] = body
                self._send(200, body)

            def do_GET(self) -> None:
                match, query = self._route()
                if match is None:
                    return self._status(404, "NotFound", self.path)
                if match["log"]:
                    lines = api.pod_logs.get(match["name"], "").splitlines(keepends=True)
                    tail = int(query.get("tailLines", ["0"])[0])
                    return self._send(200, "".join(lines[-tail:] if tail else lines), text=True)
                if match["name"] is None:
                    return self._send(200, self._list(match, query))
                obj = api.objects.get((match["plural"], match["ns"] or "", match["name"]))
                if obj is None:
                    return self._status(404, "NotFound", f'{match["plural"]} "{match["name"]}" not found')
                self._send(200, obj)

            def _list(self, match: re.Match[str], query: dict[str, list[str]]) -> dict[str, Any]:
                wanted = dict(
                    item.split("=", 1) for item in query.get("labelSelector", [""])[0].split(",") if item
                )
                items = [
                    obj
                    for (plural, ns, _), obj in api.objects.items()
                    if plural == match["plural"]
                    and ns == (match["ns"] or "")
                    and wanted.items() <= obj["metadata"].get("labels", {}).items()
                ]
                return {"apiVersion": "v1", "kind": "List", "metadata": {}, "items": items}

            def do_DELETE(self) -> None:
                match, _ = self._route()
                assert match is not None
                key = (match["plural"], match["ns"] or "", match["name"])
                options = self._body() if int(self.headers.get("Content-Length") or 0) else {}
                wanted = (options.get("preconditions") or {}).get("uid")
                obj = api.objects.get(key)
                if obj is None:
                    return self._status(404, "NotFound", f'{match["plural"]} "{match["name"]}" not found')
                if wanted and wanted != obj["metadata"].get("uid"):  # as the API server answers
                    found = obj["metadata"].get("uid")
                    message = (
                        f"Precondition failed: UID in precondition: {wanted}, UID in object meta: {found}"
                    )
                    return self._status(409, "Conflict", message)
                api.objects.pop(key)
                self._send(200, {"kind": "Status", "status": "Success"})

        return Handler
