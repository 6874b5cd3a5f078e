"""A new local-hub repo written directly as git objects, without the git command line.

Preparing the local hub for a release creates about 80 repos of one commit each. Through `git` that was
seven processes a repo (init, ls-files, add, status, commit, rev-parse, tag): 8.2 of the 16 s a cold
`zoo hub serve` took on a 2-core machine. Here a repo's first commit is written in-process from bytes already
read (and hashed) by the caller: its objects (blobs, trees, one commit) as one pack with its index, `main` and a
lightweight tag in `packed-refs`, `HEAD` and a minimal config: the repo `git init -b main`, `git add -A`,
`git commit`, `git tag` and `git gc` would leave, without a working tree (the hub server reads commits, never
files on disk; a later `zoo.publishing.hub.publish_local` into the repo works as on a clone whose working tree
was cleared).

The repo is built in a staged folder beside its place and renamed into it whole: an interrupted preparation
leaves no half-written repo where the server looks (a staged folder's name starts with '.', which no repo id
may). Standard library only.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import struct
import time
import zlib
from pathlib import Path

AUTHOR = b"icl-zoo <icl-zoo@localhost>"  # as zoo.publishing.hub._git commits
CONFIG = b"[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n\tlogallrefupdates = true\n"
# Weights, graphs and parquet are already dense: zlib gains little on them and its level 1 costs ~0.5 s for a
# release's 120 MB (even level 0 runs the deflate machinery: 0.15 s for 80 MB), so objects are written as stored
# deflate blocks by hand (`_stored`), a valid zlib stream that git inflates as any other.
BLOCK = 65535  # the most bytes one stored block holds
REF_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")  # a branch or tag this module writes


class Pack:
    """The objects of one new repo, written as one pack file and its index (git's pack format, version 2): two
    files a repo where loose objects take one file and, mostly, one folder each; on a busy disk those ~1,600
    file-system operations for a release were most of a preparation's time."""

    TYPES = {b"commit": 1, b"tree": 2, b"blob": 3}

    def __init__(self):
        self.pieces: list = []  # the pack's bytes after its 12-byte header, as buffers (no copy of a file)
        self.size = 12
        self.entries: dict[bytes, tuple[int, int]] = {}  # object id -> (offset in the pack, CRC-32 of its entry)

    def put(self, kind: bytes, data: bytes) -> str:
        sha = hashlib.sha1(b"%s %d\0" % (kind, len(data)))
        sha.update(data)
        oid = sha.digest()
        if oid not in self.entries:  # the same file twice in a repo is one object
            pieces = [_entry_header(self.TYPES[kind], len(data)), *_stored(data)]
            crc = 0
            for piece in pieces:
                crc = zlib.crc32(piece, crc)
            self.entries[oid] = (self.size, crc)
            self.pieces += pieces
            self.size += sum(len(piece) for piece in pieces)
        return oid.hex()

    def write(self, pack_dir: Path) -> None:
        if self.size >= 1 << 31:  # past 2 GiB an index needs 8-byte offsets: far beyond any release
            raise ValueError("a pack of 2 GiB or more")
        head = b"PACK" + struct.pack(">II", 2, len(self.entries))
        sha = hashlib.sha1(head)
        for piece in self.pieces:
            sha.update(piece)
        checksum = sha.digest()
        oids = sorted(self.entries)
        fanout = [0] * 256
        for oid in oids:
            fanout[oid[0]] += 1
        for i in range(1, 256):
            fanout[i] += fanout[i - 1]
        index = b"".join([b"\377tOc", struct.pack(">I", 2), struct.pack(">256I", *fanout), *oids,
                          *(struct.pack(">I", self.entries[o][1]) for o in oids),
                          *(struct.pack(">I", self.entries[o][0]) for o in oids), checksum])
        name = f"pack-{checksum.hex()}"
        with open(pack_dir / f"{name}.pack", "xb") as f:
            f.writelines([head, *self.pieces, checksum])
        (pack_dir / f"{name}.idx").write_bytes(index + hashlib.sha1(index).digest())
        for suffix in (".pack", ".idx"):
            (pack_dir / f"{name}{suffix}").chmod(0o444)  # as git leaves its packs


def _entry_header(kind: int, size: int) -> bytes:
    """A packed object's type and size: 3 bits of type and 4 of size, then 7 bits of size a byte, low first."""
    out = bytearray()
    byte = kind << 4 | size & 0x0F
    size >>= 4
    while size:
        out.append(byte | 0x80)
        byte, size = size & 0x7F, size >> 7
    out.append(byte)
    return bytes(out)


def _stored(data: bytes) -> list:
    """The zlib stream of `data` in stored (uncompressed) deflate blocks, as pieces to write: no copy of `data`.
    RFC 1950: CMF 0x78, FLG 0x01 (fastest; (0x78 << 8 | 0x01) % 31 == 0); RFC 1951 stored blocks: a BFINAL/BTYPE=00
    byte, LEN and its complement (little-endian), the bytes; then the Adler-32 of `data`, big-endian."""
    view = memoryview(data)
    blocks = [view[i:i + BLOCK] for i in range(0, len(data), BLOCK)] or [view]
    pieces = [b"\x78\x01"]
    for i, block in enumerate(blocks):
        pieces += [struct.pack("<BHH", i == len(blocks) - 1, len(block), len(block) ^ 0xFFFF), block]
    pieces.append(struct.pack(">I", zlib.adler32(data)))
    return pieces


def _tree(objects: Pack, files: dict[str, bytes]) -> str:
    """The tree object of `files` ({"a/b.txt": bytes}), its sub-trees written first."""
    here: dict[str, bytes] = {}
    below: dict[str, dict[str, bytes]] = {}
    for path, data in files.items():
        head, sep, rest = path.partition("/")
        if sep:
            below.setdefault(head, {})[rest] = data
        else:
            here[head] = data
    entries = [(name.encode(), b"100644", objects.put(b"blob", data)) for name, data in here.items()]
    entries += [(name.encode(), b"40000", _tree(objects, sub)) for name, sub in below.items()]
    # git's order: by name, a tree compared as if its name ended in '/'
    entries.sort(key=lambda e: e[0] + (b"/" if e[1] == b"40000" else b""))
    return objects.put(b"tree", b"".join(mode + b" " + name + b"\0" + bytes.fromhex(oid) for name, mode, oid in entries))


def check_files(files: dict[str, bytes]) -> None:
    """Repo paths as the hub may hold them: relative, '/'-separated, no empty, '.', '..' or '.git' part."""
    for path in files:
        parts = path.split("/")
        if not path or any(p in ("", ".", "..") or p.lower() == ".git" or "\0" in p or "\\" in p for p in parts):
            raise ValueError(f"{path!r} is not a file path a repo may hold")
    dirs = {"/".join(path.split("/")[:i]) for path in files for i in range(1, path.count("/") + 1)}
    clash = sorted(dirs & set(files))
    if clash:
        raise ValueError(f"{clash[0]!r} is both a file and a folder")


def write_new_repo(repo: Path, files: dict[str, bytes], *, message: str, tag: str | None = None,
                   when: int | None = None) -> str:
    """Create the git repo `repo` (which must not exist) holding `files` in one commit on branch main,
    tagged `tag`; returns the commit's sha."""
    repo = Path(repo)
    if os.path.lexists(repo):
        raise FileExistsError(f"{repo} exists; a new repo is written only where there is none")
    for ref in ("main", tag):
        if ref is not None and not REF_NAME.fullmatch(ref):
            raise ValueError(f"{ref!r} is not a branch or tag name this hub writes")
    check_files(files)
    repo.parent.mkdir(parents=True, exist_ok=True)
    staged = repo.parent / f".{repo.name}.staged-{secrets.token_hex(4)}"
    git_dir = staged / ".git"
    try:
        for sub in ("objects/pack", "refs"):
            (git_dir / sub).mkdir(parents=True)
        objects = Pack()
        tree = _tree(objects, files)
        stamp = b"%d +0000" % (int(time.time()) if when is None else when)
        text = message.rstrip() + "\n"  # as `git commit -m` cleans a message up
        commit = objects.put(b"commit", b"tree %s\nauthor %s %s\ncommitter %s %s\n\n%s" % (
            tree.encode(), AUTHOR, stamp, AUTHOR, stamp, text.encode()))
        objects.write(git_dir / "objects" / "pack")
        refs = [f"{commit} refs/heads/main"] + ([f"{commit} refs/tags/{tag}"] if tag is not None else [])
        (git_dir / "packed-refs").write_text("# pack-refs with: peeled fully-peeled sorted \n" + "\n".join(sorted(refs)) + "\n")
        (git_dir / "HEAD").write_text("ref: refs/heads/main\n")
        (git_dir / "config").write_bytes(CONFIG)
        os.rename(staged, repo)  # whole, or not there at all
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return commit


def remove_staged(folder: Path) -> None:
    """Remove what an interrupted `write_new_repo` left staged in `folder` (an org's folder of repos)."""
    if folder.is_dir() and not folder.is_symlink():
        for p in folder.iterdir():
            if p.name.startswith(".") and ".staged-" in p.name and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
