"""The release as one .tar.gz (`zoo release archive`) and its unpacking (`zoo release unpack`): every
member's tar header checked against the caps before anything is extracted, every file verified against
the trust root's index (or, adopted, the archive's own) before the destination changes. Loads no
torch, except where an unpack renders INDEX.md (the registry: `_install_verified`)."""

from __future__ import annotations

import gzip
import os
import shutil
import sys
import tarfile
import tempfile
import zlib
from pathlib import Path

from zoo.storage.locate import INDEX_JSON, INDEX_MD, ReleaseError, read_index, release_dir, verify_folder

# What `zoo release unpack` accepts, checked on the tar headers before anything is extracted (the whole
# release is ~35 MB in ~550 files, its largest file ~1 MB; DESIGN.md: the archive is <= 16 MiB compressed).
ARCHIVE_ROOT = "release"  # every member is release/index.json, release/INDEX.md or release/<entry>/<file>
MAX_MEMBER_BYTES = 32 * 2**20  # uncompressed bytes one archive member may declare (its tar header's size)
MAX_ARCHIVE_BYTES = 64 * 2**20  # uncompressed bytes all members of one archive may declare together
MAX_MEMBERS = 4096  # tar members (files and directories) in one archive
# Decompressed tar bytes ever read (or seeked past) in one archive: the members' data plus, per member,
# room for its header, an extended (pax / long-name) header and padding. Bounds what a header that
# declares a huge extended record could make tarfile read, before any member is seen.
MAX_TAR_STREAM = MAX_ARCHIVE_BYTES + MAX_MEMBERS * 8 * 512
NOT_AN_ARCHIVE = "not a release archive (expected a .tar.gz written by `zoo release archive`)"
_CHUNK = 2**20


def write_archive(root: Path, path: Path) -> Path:
    """One .tar.gz of the release, unpacked by `zoo release unpack`: release/index.json, INDEX.md and
    exactly the files the index lists for each entry (checked against it first), as plain regular files
    within the caps `unpack_archive` enforces. Written to a temporary name and renamed when complete."""
    root, path = Path(root), Path(path)
    if not (root / INDEX_JSON).is_file():
        raise ReleaseError(f"{root}: no {INDEX_JSON}; nothing to archive")
    index = read_index(root)
    files = [(INDEX_JSON, root / INDEX_JSON)]
    if (root / INDEX_MD).is_file():
        files.append((INDEX_MD, root / INDEX_MD))
    for name, row in sorted(index["entries"].items()):
        verify_folder(root / name, row)  # every listed file present, regular and with its hash; nothing else
        files += [(f"{name}/{file}", root / name / file) for file in sorted(row["files"])]
    total = 0
    for arcname, p in files:
        if p.is_symlink() or not p.is_file():
            raise ReleaseError(f"{p}: not a regular file; an archive holds regular files only")
        size = p.stat().st_size
        total += size
        if size > MAX_MEMBER_BYTES or total > MAX_ARCHIVE_BYTES:
            raise ReleaseError(f"{p}: the archive would exceed MAX_MEMBER_BYTES = {MAX_MEMBER_BYTES} per file or "
                               f"MAX_ARCHIVE_BYTES = {MAX_ARCHIVE_BYTES} in all; `zoo release unpack` would refuse it")
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tarfile.open(tmp, "w:gz", format=tarfile.PAX_FORMAT) as tar:
            for arcname, p in files:
                info = tar.gettarinfo(p, arcname=f"{ARCHIVE_ROOT}/{arcname}")
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mode = 0o644
                with open(p, "rb") as f:
                    tar.addfile(info, f)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


class _CappedStream:
    """The decompressed tar stream, read-only, refusing any read or seek past `cap` bytes: whatever a header
    declares (a member's size, a pax record, a long name), tarfile never reads or skips more than that."""

    def __init__(self, raw, cap: int, archive: Path):
        self.raw, self.cap, self.archive = raw, cap, archive

    def _within(self, end: int) -> None:
        if end > self.cap:
            raise ReleaseError(f"{self.archive}: its tar stream runs past {self.cap} bytes (MAX_TAR_STREAM, "
                               "bytes of tar data read at most); refusing it before extracting anything")

    def tell(self) -> int:
        return self.raw.tell()

    def read(self, size: int = -1) -> bytes:
        pos = self.raw.tell()
        if size is None or size < 0:
            size = self.cap - pos
        self._within(pos + size)
        return self.raw.read(size)

    def seek(self, offset: int, whence: int = 0) -> int:
        target = offset + (self.raw.tell() if whence == 1 else 0)
        if whence not in (0, 1):
            raise OSError("a release archive is read front to back")
        self._within(target)
        return self.raw.seek(target)


class _NotAnArchive:
    """Turns what tarfile and gzip raise on a file that is not a whole .tar.gz into one-line ReleaseErrors."""

    def __init__(self, archive: Path):
        self.archive = archive

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb):
        if e is None or isinstance(e, ReleaseError):
            return False
        if isinstance(e, (tarfile.TarError, EOFError, zlib.error, OSError, ValueError)):  # gzip.BadGzipFile: OSError
            detail = " ".join(str(e).split())[:200] or "no detail"
            raise ReleaseError(f"{self.archive}: {NOT_AN_ARCHIVE}: {type(e).__name__}: {detail}") from None
        return False


def _member_parts(m: tarfile.TarInfo, archive: Path) -> tuple[str, ...]:
    """The member's path, normalised ('.' and empty components dropped), checked to stay under release/."""
    name = m.name
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if (not parts or parts[0] != ARCHIVE_ROOT or name.startswith("/") or ".." in parts
            or any("\\" in p or "\0" in p for p in parts)):
        raise ReleaseError(f"{archive}: refusing archive member {name!r} (only regular files under {ARCHIVE_ROOT}/)")
    return parts


def _archive_members(tar: tarfile.TarFile, archive: Path) -> list[tuple[tarfile.TarInfo, tuple[str, ...]]]:
    """Every member's header checked, before anything is extracted: a normalised path under release/ at
    most one folder deep, each name once, a plain regular file (directories are skipped), not sparse, its
    declared size within MAX_MEMBER_BYTES and the total within MAX_ARCHIVE_BYTES. Headers are read one
    by one, so a member is refused before tarfile skips (decompresses) its data."""
    files: list[tuple[tarfile.TarInfo, tuple[str, ...]]] = []
    seen: set[str] = set()
    folders: set[str] = set()
    total = count = 0
    with _NotAnArchive(archive):
        while True:
            m = tar.next()
            if m is None:
                break
            count += 1
            if count > MAX_MEMBERS:
                raise ReleaseError(f"{archive}: more than MAX_MEMBERS = {MAX_MEMBERS} members; refusing it")
            parts = _member_parts(m, archive)
            key = "/".join(parts).casefold()  # one name once, also on a case-insensitive file system
            if key in seen:
                raise ReleaseError(f"{archive}: archive member {m.name!r} appears twice; refusing the archive")
            seen.add(key)
            if m.type == tarfile.DIRTYPE:
                if len(parts) > 2:
                    raise ReleaseError(f"{archive}: refusing archive member {m.name!r} (a folder below an entry folder)")
                continue
            if m.size > MAX_MEMBER_BYTES:
                raise ReleaseError(f"{archive}: archive member {m.name!r} declares {m.size} bytes, over "
                                   f"MAX_MEMBER_BYTES = {MAX_MEMBER_BYTES} (bytes one member may hold); refusing it "
                                   "before extracting anything")
            total += m.size
            if total > MAX_ARCHIVE_BYTES:
                raise ReleaseError(f"{archive}: archive members up to {m.name!r} declare {total} bytes, over "
                                   f"MAX_ARCHIVE_BYTES = {MAX_ARCHIVE_BYTES} (bytes all members may hold); refusing "
                                   "it before extracting anything")
            if m.issparse() or m.type == tarfile.GNUTYPE_SPARSE or any(k.startswith("GNU.sparse") for k in m.pax_headers):
                raise ReleaseError(f"{archive}: refusing archive member {m.name!r} (a sparse file; only plain regular files)")
            if m.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
                kind = {tarfile.SYMTYPE: "a symlink", tarfile.LNKTYPE: "a hard link", tarfile.CHRTYPE: "a device",
                        tarfile.BLKTYPE: "a device", tarfile.FIFOTYPE: "a FIFO"}.get(m.type, f"tar type {m.type!r}")
                raise ReleaseError(f"{archive}: refusing archive member {m.name!r} ({kind}; only regular files under "
                                   f"{ARCHIVE_ROOT}/)")
            if len(parts) not in (2, 3):
                raise ReleaseError(f"{archive}: refusing archive member {m.name!r} (files are {ARCHIVE_ROOT}/<file> "
                                   f"or {ARCHIVE_ROOT}/<entry>/<file>)")
            files.append((m, parts))
            folders.update("/".join(parts[:i]).casefold() for i in range(2, len(parts)))
        stream = tar.fileobj  # after the end-of-archive blocks: zero padding only (reading it checks the gzip CRC)
        while chunk := stream.raw.read(min(_CHUNK, stream.cap - stream.tell() + 1)):
            if chunk.strip(b"\0") or stream.tell() > stream.cap:
                raise ReleaseError(f"{archive}: data after the end of its tar archive; refusing it")
    clash = sorted(folders & {"/".join(p).casefold() for _, p in files})
    if clash:
        raise ReleaseError(f"{archive}: archive member {clash[0]!r} is both a file and a folder; refusing the archive")
    return files


def _extract_members(tar: tarfile.TarFile, files, into: Path, archive: Path) -> None:
    """Write the checked members below `into` as new regular files, reading at most each one's declared size."""
    for m, parts in files:
        target = into.joinpath(*parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        with _NotAnArchive(archive):
            source = tar.extractfile(m)
        with open(target, "xb") as out:
            left = m.size
            while left:
                with _NotAnArchive(archive):
                    chunk = source.read(min(left, _CHUNK))
                if not chunk:
                    raise ReleaseError(f"{archive}: archive member {m.name!r} ends after {m.size - left} of the "
                                       f"{m.size} bytes it declares; refusing the archive")
                out.write(chunk)
                left -= len(chunk)


def _verified_index(staged: Path, archive: Path, adopt_index: bool) -> dict:
    """The archive's index, checked: it covers every folder in the archive, and every entry folder holds
    exactly its row's files with their hashes. Default: every row is the shipped (trust root) row."""

    def where(e: Exception) -> str:
        return f"{archive}: " + str(e).replace(str(staged), ARCHIVE_ROOT)

    if not (staged / INDEX_JSON).is_file():
        raise ReleaseError(f"{archive}: carries no {ARCHIVE_ROOT}/{INDEX_JSON}; refusing it")
    try:
        index = read_index(staged)
    except ReleaseError as e:
        raise ReleaseError(where(e)) from None
    covered = {INDEX_JSON, INDEX_MD, *index["entries"]}
    strays = sorted(p.name for p in staged.iterdir() if p.name not in covered)
    if strays:  # nothing the index does not vouch for is installed
        raise ReleaseError(f"{archive}: members not covered by its index: {', '.join(strays)}")
    rows = index["entries"]
    if not adopt_index:  # the shipped index is the trust root: the archive may carry a subset of its rows, unchanged
        shipped_path = release_dir() / INDEX_JSON
        shipped = read_index()
        if index.get("version") != shipped.get("version"):
            raise ReleaseError(f"{archive}: its index is release {index.get('version')!r}, the shipped index "
                               f"({shipped_path}) is {shipped.get('version')!r}; refusing it (a new release built "
                               "elsewhere is adopted with --adopt-index)")
        for name, row in rows.items():
            if shipped["entries"].get(name) != row:
                what = "is not in" if name not in shipped["entries"] else "differs from"
                raise ReleaseError(f"{archive}: its index row for {name} {what} the shipped index ({shipped_path}); "
                                   "refusing it (a new release built elsewhere is adopted with --adopt-index)")
    for name, row in rows.items():
        try:
            verify_folder(staged / name, row)
        except ReleaseError as e:
            raise ReleaseError(where(e)) from None
    return index


def _install(staged: Path, dest: Path, names: list[str], aside_in: Path) -> None:
    """Move staged/<name> to dest/<name> for each name: what was there is moved aside first and deleted only
    once every name is in place; if any move fails, everything is put back as it was."""
    aside = Path(tempfile.mkdtemp(dir=aside_in, prefix=".unpack-old-"))
    moved: list[str] = []
    installed: list[str] = []
    try:
        for name in names:
            target = dest / name
            if target.exists() or target.is_symlink():
                os.replace(target, aside / name)
                moved.append(name)
            os.replace(staged / name, target)
            installed.append(name)
    except BaseException:
        for name in reversed(installed):
            try:
                os.replace(dest / name, staged / name)
            except OSError:
                pass
        for name in reversed(moved):
            try:
                os.replace(aside / name, dest / name)
            except OSError:
                pass
        shutil.rmtree(aside, ignore_errors=True)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def _install_verified(staged: Path, archive: Path, dest: Path, anchor: Path, *, adopt_index: bool,
                      into_trust_root: bool) -> dict:
    """Verify the staged release (`_verified_index`), then move it into `dest`; returns the archive's index."""
    # Deferred: INDEX.md is rendered with the registry (and torch), loaded only when this unpack renders it
    from zoo.publishing.release.index import index_markdown

    staged.mkdir(exist_ok=True)
    index = _verified_index(staged, archive, adopt_index)
    names = sorted(index["entries"])
    if adopt_index or not into_trust_root:  # the trust root's own index is never replaced by default
        if not adopt_index or not (staged / INDEX_MD).is_file():
            # INDEX.md is not hashed by the index: by default it is rendered here from the verified rows
            try:
                (staged / INDEX_MD).write_text(index_markdown(index))
            except (KeyError, TypeError, ValueError) as e:
                raise ReleaseError(f"{archive}: cannot render {INDEX_MD} from its index ({type(e).__name__}: "
                                   f"{str(e)[:200]})") from None
        names += [INDEX_MD, INDEX_JSON]  # the index last: it never vouches for folders not yet in place
    if dest.exists():
        _install(staged, dest, names, anchor)
        return index
    for p in staged.iterdir():  # a new dest: only what is installed, all at once by one rename
        if p.name not in names:
            if p.is_dir():
                shutil.rmtree(p)
            else:
                p.unlink()
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staged, dest)
    return index


def unpack_archive(path: Path, dest: Path, *, adopt_index: bool = False) -> Path:
    """Unpack a release archive (`write_archive`) into `dest` (a `release/` folder).

    Every member's tar header is checked before anything is extracted (`_archive_members`: regular files
    under release/ only, each name once, within MAX_MEMBER_BYTES / MAX_ARCHIVE_BYTES); the files are staged
    and checked, and `dest` changes only once all of them verified. By default each entry folder is
    verified against the SHIPPED index (`read_index()`, the trust root): the archive's index rows must
    equal the shipped rows of the entries it carries; unpacked into the trust root itself, its index is
    kept. `adopt_index=True` (`zoo release unpack --adopt-index`, a new release built elsewhere) checks
    each folder against the archive's own index instead, and that index becomes the trust root of `dest`.
    Errors are one-line ReleaseErrors naming the archive."""
    path, dest = Path(path), Path(dest)
    if not path.is_file():
        raise ReleaseError(f"{path}: {NOT_AN_ARCHIVE}: {'a folder' if path.is_dir() else 'no such file'}")
    if dest.exists() and not dest.is_dir():
        raise ReleaseError(f"{dest}: not a folder; cannot unpack {path} into it")
    into_trust_root = dest.exists() and release_dir().exists() and dest.resolve() == release_dir().resolve()
    anchor = _staging_anchor(dest)
    with gzip.GzipFile(path, "rb") as raw:
        with _NotAnArchive(path):
            tar = tarfile.open(fileobj=_CappedStream(raw, MAX_TAR_STREAM, path), mode="r:")  # noqa: SIM115 (`with tar` below)
        with tar:
            files = _archive_members(tar, path)
            with tempfile.TemporaryDirectory(dir=anchor, prefix=".unpack-") as tmp:
                _extract_members(tar, files, Path(tmp), path)
                index = _install_verified(Path(tmp) / ARCHIVE_ROOT, path, dest, anchor, adopt_index=adopt_index,
                                          into_trust_root=into_trust_root)
    if adopt_index:
        _say_adopted(path, dest, index)
    return dest


def _staging_anchor(dest: Path) -> Path:
    """Where the staging (and the old files moved aside) lie: the nearest existing folder above `dest`, on
    dest's file system (inside dest, as dotted folders never archived, if it is a mount point): dest is
    untouched until everything verified, and each file moves into it by a rename."""
    anchor = next(p for p in dest.absolute().parents if p.is_dir())
    if dest.is_dir() and os.stat(dest).st_dev != os.stat(anchor).st_dev:
        anchor = dest
    return anchor


def _say_adopted(path: Path, dest: Path, index: dict) -> None:
    """On stderr: the archive's index is now the trust root of `dest`, and which folders there it does not list."""
    orphans = sorted(p.name for p in dest.iterdir() if p.is_dir() and not p.name.startswith(".")
                     and p.name not in index["entries"])
    print(f"--adopt-index: the index of {path} (release {index.get('version')}, {len(index['entries'])} entries) "
          f"is now the trust root of {dest}; its files were checked against that index, not against the one "
          "shipped before" + (f". Folders it does not list: {', '.join(orphans)}" if orphans else ""),
          file=sys.stderr)
