"""The local hub's HTTP server: olah's FastAPI app, in-process, behind a guard that lets through only
read requests for a repo of the hub (`python -m zoo.hub_server --config olah.toml`, started by
`zoo.hub.start_server`).

olah maps a request's repo id straight onto `<mirror>/<type>/<org>/<name>`, so a raw `../..` (or
`%2e%2e`) in the URL would reach files above the hub. The guard parses the *raw* request path
itself, percent-decodes each part once (anything still holding '%' is refused), and passes the
request on only when it is GET/HEAD, has one of the routes the Hugging Face clients use, names a
valid `ORG/NAME` that is a git repository inside the hub root, a plain revision and a relative file
path without '.'/'..'/empty parts, backslashes or control characters; and only when the decoded
path the app routes on (`scope["path"]`) is exactly the one that was checked. Everything else gets
a short JSON error and never reaches olah.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from urllib.parse import unquote

from zoo.locate import HubError, validate_repo_id

REPO_TYPES = ("models", "datasets")
REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")


class Refused(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def _decode(raw: str, what: str) -> str:
    """One percent-decoding of `raw`; refused when the result is not plain (still '%', '\\', control chars)."""
    try:
        text = unquote(raw, errors="strict")
    except UnicodeDecodeError:
        raise Refused(400, f"{what} is not valid UTF-8") from None
    if "%" in text or "\\" in text or any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise Refused(400, f"{what} holds '%', a backslash or a control character")
    return text


def _segment(raw: str, what: str) -> str:
    text = _decode(raw, what)
    if text in ("", ".", "..") or "/" in text:
        raise Refused(400, f"{what} must be one plain path segment")
    return text


def _revision(raw: str) -> None:
    rev = _segment(raw, "revision")
    if not REVISION.match(rev) or ".." in rev:
        raise Refused(400, "invalid revision: a branch, tag or commit name")


def _file_path(raw_parts: list[str], what: str = "file path") -> str:
    text = _decode("/".join(raw_parts), what)
    if any(part in ("", ".", "..") for part in text.split("/")):
        raise Refused(400, f"{what} must be relative, without '.', '..' or empty parts")
    return text


def _repo(root: Path, repo_type: str, org: str, name: str) -> None:
    try:
        validate_repo_id(f"{org}/{name}")
    except HubError:
        raise Refused(404, "Repository not found") from None
    path = root / repo_type / org / name
    resolved = path.resolve()
    inside = root.resolve() in resolved.parents
    is_git = (path / ".git").exists() or ((path / "HEAD").is_file() and (path / "objects").is_dir())
    if not (inside and path.is_dir() and is_git):
        raise Refused(404, "Repository not found")


def check(method: str, raw_path: bytes, path: str, root: Path) -> None:
    """Raise `Refused` unless this request may be passed to olah (see the module docstring)."""
    if method not in ("GET", "HEAD"):
        raise Refused(405, "the local hub is read-only: GET and HEAD only")
    try:
        raw = raw_path.decode("ascii")
    except UnicodeDecodeError:
        raise Refused(400, "the request path is not ASCII") from None
    raw = raw.split("?", 1)[0]
    if not raw.startswith("/") or unquote(raw) != path:
        raise Refused(400, "the request path is not in canonical form")
    parts = raw[1:].split("/")
    if parts[0] == "api":  # /api/{models|datasets}/ORG/NAME[/revision/REV | /commits/REV | /refs | /tree/REV[/PATH]]
        if len(parts) < 4:
            raise Refused(404, "unknown route")
        repo_type = _segment(parts[1], "repo type")
        if repo_type not in REPO_TYPES:
            raise Refused(404, "unknown route")
        org, name = _segment(parts[2], "organisation"), _segment(parts[3], "repo name")
        rest = parts[4:]
        if rest:
            action = _segment(rest[0], "route")
            if not (action == "refs" and len(rest) == 1 or action in ("revision", "commits") and len(rest) == 2
                    or action == "tree" and len(rest) >= 2):
                raise Refused(404, "unknown route")
            if action != "refs":
                _revision(rest[1])
            if len(rest) > 2 and rest[2:] != [""]:  # `tree/REV/` lists the root
                _file_path(rest[2:])
    else:  # [/datasets]/ORG/NAME/resolve/REV/PATH
        repo_type = "models"
        if parts[0] == "datasets":
            repo_type, parts = "datasets", parts[1:]
        if len(parts) < 5 or parts[2] != "resolve":
            raise Refused(404, "unknown route")
        org, name = _segment(parts[0], "organisation"), _segment(parts[1], "repo name")
        if org in REPO_TYPES + ("api", "repos", "spaces"):
            raise Refused(404, "unknown route")
        _revision(parts[3])
        _file_path(parts[4:])
    _repo(root, repo_type, org, name)


class Guard:
    """Pure-ASGI middleware: `check` every HTTP request before `app` sees it."""

    def __init__(self, app, root: Path):
        self.app, self.root = app, Path(root).resolve()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            return await self.app(scope, receive, send)
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            return
        try:
            check(scope["method"], scope.get("raw_path") or b"", scope["path"], self.root)
        except Refused as e:
            print(f"refused {scope['method']} {scope.get('raw_path')!r}: {e.message}", file=sys.stderr, flush=True)
            body = json.dumps({"error": e.message}).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            if e.status == 404:
                headers.append((b"x-error-code", b"RepoNotFound"))
            headers.append((b"x-error-message", e.message.encode("ascii", "replace")))
            await send({"type": "http.response.start", "status": e.status, "headers": headers})
            await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})
            return
        await self.app(scope, receive, send)


def main(argv: list[str] | None = None) -> None:
    import argparse
    import os

    p = argparse.ArgumentParser(description="olah over an icl-zoo local hub, behind the request guard")
    p.add_argument("--config", required=True)
    p.add_argument("--log-path", default="./logs")
    args = p.parse_args(argv)
    os.environ.pop("OLAH_CONFIG", None)  # configured below, from our file only

    import uvicorn
    from olah import server
    from olah.configs import OlahConfig
    from olah.utils.logging import build_logger

    config = OlahConfig(args.config)
    if len(config.mirrors_path) != 1 or not config.offline:
        raise SystemExit("the local hub server takes exactly one mirrors-path and offline = true")
    server.logger = build_logger("olah", "olah.log", logger_dir=args.log_path)
    server.app.state.logger = server.logger
    server.app.state.app_settings = server.AppSettings(config=config)
    uvicorn.run(Guard(server.app, Path(config.mirrors_path[0])), host=config.host, port=config.port,
                log_level="info", reload=False)


if __name__ == "__main__":
    main()
