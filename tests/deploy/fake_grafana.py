"""A fake Grafana HTTP API (the few endpoints `teye dashboards push` uses) that records every request."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, List, Optional, Tuple


class FakeGrafana:
    """GET/POST /api/folders, POST /api/dashboards/db, POST /api/annotations.

    ``token``: the only Bearer token accepted (others get 401).
    ``reject``: dashboard uid -> (HTTP status, message) answered instead of saving it.
    """

    def __init__(self, token: str = "good-token", reject: Optional[Dict[str, Tuple[int, str]]] = None):
        self.token = token
        self.reject = dict(reject or {})
        self.requests: List[dict] = []          # {"method", "path", "auth", "body"}
        self.folders: List[dict] = []           # {"uid", "title", "id"}
        self.dashboards: Dict[str, dict] = {}   # uid -> {"dashboard", "folderUid", "version"}
        self.annotations: List[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def _answer(self, status: int, body) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                auth = self.headers.get("Authorization", "")
                fake.requests.append({"method": method, "path": self.path, "auth": auth, "body": body})
                if auth != f"Bearer {fake.token}":
                    return self._answer(401, {"message": "invalid API key"})
                path = self.path.split("?")[0]
                if method == "GET" and path == "/api/folders":
                    return self._answer(200, [{"id": f["id"], "uid": f["uid"], "title": f["title"]}
                                              for f in fake.folders])
                if method == "POST" and path == "/api/folders":
                    if any(f["uid"] == body.get("uid") or f["title"] == body["title"] for f in fake.folders):
                        return self._answer(409, {"message": "a folder with the same name already exists"})
                    f = {"id": len(fake.folders) + 1, "uid": body.get("uid") or f"f{len(fake.folders) + 1}",
                         "title": body["title"]}
                    fake.folders.append(f)
                    return self._answer(200, f)
                if method == "POST" and path == "/api/dashboards/db":
                    dash = body["dashboard"]
                    uid = dash.get("uid")
                    if uid in fake.reject:
                        status, msg = fake.reject[uid]
                        return self._answer(status, {"message": msg, "status": "rejected"})
                    if not any(f["uid"] == body.get("folderUid") for f in fake.folders):
                        return self._answer(400, {"message": "folder not found"})
                    old = fake.dashboards.get(uid)
                    if old is not None and not body.get("overwrite"):
                        return self._answer(412, {"message": "A dashboard with the same uid already exists",
                                                  "status": "name-exists"})
                    version = old["version"] + 1 if old else 1
                    fake.dashboards[uid] = {"dashboard": dash, "folderUid": body.get("folderUid"),
                                            "version": version}
                    return self._answer(200, {"id": 1, "uid": uid, "url": f"/d/{uid}/x", "status": "success",
                                              "version": version})
                if method == "POST" and path == "/api/annotations":
                    fake.annotations.append(body)
                    return self._answer(200, {"id": len(fake.annotations), "message": "Annotation added"})
                return self._answer(404, {"message": "not found"})

            def do_GET(self):
                self._handle("GET")

            def do_POST(self):
                self._handle("POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeGrafana":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def dashboard_posts(self) -> List[dict]:
        return [r["body"] for r in self.requests if r["method"] == "POST" and r["path"] == "/api/dashboards/db"]
