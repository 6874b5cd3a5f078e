"""An httpx transport answering the Hub API calls icl-zoo makes (repos, commits, tags, a collection),
recording them: the real-Hub paths are tested at the HTTP boundary."""

import base64
import json

import httpx

COLLECTION = {"slug": "org/icl-zoo-v0-1", "title": "icl-zoo", "owner": {"name": "org"}, "items": [],
              "lastUpdated": "2026-01-01T00:00:00.000Z", "position": 0, "private": False, "theme": "blue", "upvotes": 0}


class FakeHub:
    def __init__(self):
        self.calls = []  # (method, host, path, authorization)
        self.committed = []  # (path in repo, bytes)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        self.calls.append((request.method, request.url.host, path, request.headers.get("authorization")))
        if path == "/api/repos/create":
            body = json.loads(request.content)
            return httpx.Response(200, json={"url": f"https://hub.test/{body['organization']}/{body['name']}"})
        if path == "/api/validate-yaml":
            return httpx.Response(200, json={"errors": [], "warnings": []})
        if path.endswith("/preupload/main"):
            files = json.loads(request.content)["files"]
            return httpx.Response(200, json={"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]})
        if path.endswith("/commit/main"):
            for line in request.content.decode().splitlines():
                item = json.loads(line)
                if item["key"] == "file":
                    self.committed.append((item["value"]["path"], base64.b64decode(item["value"]["content"])))
            return httpx.Response(200, json={"commitUrl": "https://hub.test/c/" + "b" * 40, "commitOid": "b" * 40})
        if path.endswith("/tag/main"):
            return httpx.Response(200, json={})
        if path == "/api/collections" or (path.startswith("/api/collections/") and path.endswith("/items")):
            return httpx.Response(200, json=COLLECTION)
        return httpx.Response(404, json={"error": f"unexpected call {path}"})

    @property
    def paths(self) -> list[str]:
        return [c[2] for c in self.calls if c[2] != "/api/agent-harnesses"]
