"""`zoo release archive` / `zoo release unpack`: an archive is checked against the SHIPPED index (the trust
root) unless --adopt-index says it brings a new release; every tar header is checked before anything is
extracted (names, types, duplicates, size caps); whatever is not a whole .tar.gz fails in one line; `dest`
changes only once everything verified. Archives are built by hand with tarfile and io.BytesIO."""

import gzip
import hashlib
import io
import json
import shutil
import tarfile
import zipfile
from pathlib import Path

import pytest

from zoo.cli import main
from zoo.publishing import release
from zoo.publishing.release import archive as release_archive  # where the caps and os.replace are looked up
from zoo.storage.manifest import sha256_file

NAMES = ["lsa-gd-zucchet-icl", "gated-rnn-zucchet-icl"]  # two small released entries
LSA = NAMES[0]
GIB16 = 16 * 2**30


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """A trust root of two released entries copied from the real release; ICL_ZOO_RELEASE points at it."""
    real = release.release_dir()
    index = release.read_index(real)
    root = tmp_path / "shipped"
    for n in NAMES:
        shutil.copytree(real / n, root / n)
    rows = {"version": index["version"], "entries": {n: index["entries"][n] for n in NAMES}}
    (root / release.INDEX_JSON).write_text(json.dumps(rows, indent=1))
    monkeypatch.setenv("ICL_ZOO_RELEASE", str(root))
    assert release.release_dir() == root
    return root


def members_of(root: Path) -> dict[str, bytes]:
    """What an archive of `root` holds: arcname -> bytes."""
    return {"release/" + p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def tar_gz(path: Path, members) -> Path:
    """A .tar.gz of (name, bytes) pairs, or of (TarInfo, bytes | None) pairs for special members."""
    with tarfile.open(path, "w:gz") as tar:
        for item, data in members.items() if isinstance(members, dict) else members:
            info = item if isinstance(item, tarfile.TarInfo) else tarfile.TarInfo(item)
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)
    return path


def header(name: str, size: int, data: bytes = b"") -> bytes:
    """One raw PAX tar header for a regular file of declared `size`, followed by `data` (may be short)."""
    info = tarfile.TarInfo(name)
    info.size = size
    return info.tobuf(format=tarfile.PAX_FORMAT) + data + b"\0" * (-len(data) % 512)


def gnu_sparse_header(name: str, realsize: int, stored: int = 512) -> bytes:
    """A GNU sparse ('S') header: `stored` bytes of data that expand to a `realsize`-byte file (tarfile
    reads these but cannot write them)."""
    info = tarfile.TarInfo(name)
    info.type = tarfile.GNUTYPE_SPARSE
    info.size = stored
    buf = bytearray(info.tobuf(format=tarfile.GNU_FORMAT))
    buf[386:398] = tarfile.itn(realsize - stored, 12, tarfile.GNU_FORMAT)  # the one data chunk: offset
    buf[398:410] = tarfile.itn(stored, 12, tarfile.GNU_FORMAT)  # and length
    buf[483:495] = tarfile.itn(realsize, 12, tarfile.GNU_FORMAT)  # the expanded size
    buf[148:156] = b" " * 8
    buf[148:155] = b"%06o\0" % sum(buf[:512])
    return bytes(buf)


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def no_extraction(monkeypatch):
    """Any extraction from a tar fails the test: refusal must come from the headers alone."""
    def forbidden(*a, **k):
        raise AssertionError("a member was extracted before the archive was refused")

    for method in ("extractfile", "extract", "extractall"):
        monkeypatch.setattr(tarfile.TarFile, method, forbidden)


def tampered(members: dict[str, bytes], *, rewrite_index: bool) -> dict[str, bytes]:
    """An edited card in one entry; with rewrite_index the archive's own index records the new hash
    (self-consistent, but not the shipped release)."""
    members = dict(members)
    members[f"release/{LSA}/README.md"] += b"\nedited\n"
    if rewrite_index:
        index = json.loads(members["release/index.json"])
        index["entries"][LSA]["files"]["README.md"] = hashlib.sha256(members[f"release/{LSA}/README.md"]).hexdigest()
        members["release/index.json"] = json.dumps(index).encode()
    return members


# ---------------------------------------------------------------- roundtrips
def test_roundtrip_verifies_against_the_shipped_index(shipped, tmp_path):
    archive = release.write_archive(shipped, tmp_path / "release.tar.gz")
    with tarfile.open(archive) as tar:  # exactly the index and the files it lists, as plain files
        names = tar.getnames()
        assert all(m.isreg() and not m.issparse() and m.uid == 0 for m in tar.getmembers())
    assert names[0] == "release/index.json" and len(names) == len(set(names))
    dest = release.unpack_archive(archive, tmp_path / "out" / "release")
    index = release.read_index(dest)
    assert index == release.read_index()
    for name, row in index["entries"].items():
        release.verify_folder(dest / name, row)
    assert (dest / release.INDEX_MD).is_file()  # rendered from the verified rows
    assert not [p for p in (tmp_path / "out").iterdir() if p.name != "release"]  # no staging left behind

    subset = {k: v for k, v in members_of(shipped).items() if not k.startswith(f"release/{NAMES[1]}/")}
    index = json.loads(subset["release/index.json"])
    del index["entries"][NAMES[1]]
    subset["release/index.json"] = json.dumps(index).encode()
    dirs = [(tarfile.TarInfo(d), None) for d in ("release", f"release/{LSA}")]
    for d, _ in dirs:
        d.type = tarfile.DIRTYPE
    archive = tar_gz(tmp_path / "subset.tar.gz", dirs + list(subset.items()))  # pure folders are fine
    dest = release.unpack_archive(archive, tmp_path / "sub" / "release")
    assert sorted(p.name for p in dest.iterdir()) == sorted([LSA, release.INDEX_JSON, release.INDEX_MD])


def test_unpacking_into_the_trust_root_repairs_it_and_keeps_its_index(shipped, tmp_path):
    archive = release.write_archive(shipped, tmp_path / "release.tar.gz")
    before = tree(shipped)
    (shipped / LSA / "README.md").write_text("# damaged\n")
    (shipped / NAMES[1] / "model.onnx").unlink()
    release.unpack_archive(archive, shipped)
    assert tree(shipped) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["release.tar.gz", "shipped"]  # nothing left aside

    one = members_of(shipped)  # an archive of one entry leaves the others and the index as they are
    one = {k: v for k, v in one.items() if k.startswith(f"release/{LSA}/")}
    index = release.read_index()
    one["release/index.json"] = json.dumps({"version": index["version"], "entries": {LSA: index["entries"][LSA]}}).encode()
    (shipped / LSA / "README.md").write_text("# damaged\n")
    release.unpack_archive(tar_gz(tmp_path / "one.tar.gz", one), shipped)
    assert tree(shipped) == before


def test_adopt_index_brings_a_new_release_and_makes_it_the_trust_root(shipped, tmp_path, capsys):
    built = tmp_path / "gpu" / "release"  # a release built elsewhere: one card differs, its index says so
    for path, data in tampered(members_of(shipped), rewrite_index=True).items():
        (built.parent / path).parent.mkdir(parents=True, exist_ok=True)
        (built.parent / path).write_bytes(data)
    archive = release.write_archive(built, tmp_path / "new.tar.gz")
    new = members_of(built)
    before = tree(shipped)
    with pytest.raises(release.ReleaseError, match=f"row for {LSA} differs from the shipped index"):
        release.unpack_archive(archive, tmp_path / "elsewhere" / "release")
    assert not (tmp_path / "elsewhere").exists()
    with pytest.raises(release.ReleaseError, match=f"row for {LSA} differs from the shipped index"):
        release.unpack_archive(archive, shipped)
    assert tree(shipped) == before

    release.unpack_archive(archive, shipped, adopt_index=True)
    assert "is now the trust root" in capsys.readouterr().err
    assert release.read_index() == json.loads(new["release/index.json"])
    assert (shipped / LSA / "README.md").read_bytes() == new[f"release/{LSA}/README.md"]
    release.verify_folder(shipped / LSA, release.read_index()["entries"][LSA])

    broken = tampered(members_of(shipped), rewrite_index=False)  # adopting still checks each folder
    with pytest.raises(release.ReleaseError, match="README.md has SHA-256"):
        release.unpack_archive(tar_gz(tmp_path / "broken.tar.gz", broken), tmp_path / "b" / "release", adopt_index=True)
    stray = {**members_of(shipped), "release/other-entry/config.json": b"{}"}
    with pytest.raises(release.ReleaseError, match="not covered by its index: other-entry"):
        release.unpack_archive(tar_gz(tmp_path / "stray.tar.gz", stray), tmp_path / "s" / "release", adopt_index=True)
    assert not (tmp_path / "b").exists() and not (tmp_path / "s").exists()


def test_cli_unpack_default_and_adopt_index(shipped, tmp_path, capsys):
    archive = tar_gz(tmp_path / "new.tar.gz", tampered(members_of(shipped), rewrite_index=True))
    dest = tmp_path / "cli" / "release"
    assert main(["release", "unpack", str(archive), "--root", str(dest)]) == 1
    err = capsys.readouterr().err
    assert "differs from the shipped index" in err and err.count("\n") == 1 and not dest.exists()
    assert main(["release", "unpack", str(archive), "--root", str(dest), "--adopt-index"]) == 0
    out = capsys.readouterr()
    assert "TRUST ROOT" in out.out and "trust root" in out.err
    assert release.read_index(dest)["entries"][LSA]["files"]["README.md"] == sha256_file(dest / LSA / "README.md")


# ---------------------------------------------------------------- (a) an archive does not vouch for itself
@pytest.mark.parametrize("how", ["self-consistent", "file-only", "unknown-entry", "other-version"])
def test_tampered_archive_is_refused_against_the_shipped_index(shipped, tmp_path, how):
    members = members_of(shipped)
    if how in ("self-consistent", "file-only"):
        members = tampered(members, rewrite_index=how == "self-consistent")
        match = f"row for {LSA} differs from the shipped index" if how == "self-consistent" else "README.md has SHA-256"
    else:
        index = json.loads(members["release/index.json"])
        if how == "unknown-entry":  # an entry the shipped release does not have
            row = dict(index["entries"][LSA], entry="lsa-gd-zucchet-icl-x")
            index["entries"]["lsa-gd-zucchet-icl-x"] = row
            members.update({k.replace(f"/{LSA}/", "/lsa-gd-zucchet-icl-x/"): v for k, v in members.items()
                            if k.startswith(f"release/{LSA}/")})
            match = "row for lsa-gd-zucchet-icl-x is not in the shipped index"
        else:
            index["version"] = "v999"
            match = "its index is release 'v999'"
        members["release/index.json"] = json.dumps(index).encode()
    dest = tmp_path / "out" / "release"
    with pytest.raises(release.ReleaseError, match=match) as e:
        release.unpack_archive(tar_gz(tmp_path / "a.tar.gz", members), dest)
    assert "\n" not in str(e.value)
    assert how == "file-only" or "--adopt-index" in str(e.value)  # says how a new release is brought in
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- (b) each name once, regular files only
@pytest.mark.parametrize("second", ["release/index.json", "release/./index.json", "release//index.json",
                                    "./release/index.json", "release/INDEX.JSON"])
@pytest.mark.parametrize("adopt", [False, True])
def test_a_member_name_twice_is_refused(shipped, tmp_path, second, adopt):
    members = list(members_of(shipped).items())
    evil = json.dumps({"version": release.read_index()["version"], "entries": {}}).encode()
    members.append((second, evil))  # a later index.json must not silently win
    with pytest.raises(release.ReleaseError, match="appears twice"):
        release.unpack_archive(tar_gz(tmp_path / "dup.tar.gz", members), tmp_path / "out" / "release", adopt_index=adopt)
    assert not (tmp_path / "out").exists()


def _special(name: str, kind: bytes, **attrs) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    for k, v in attrs.items():
        setattr(info, k, v)
    return info


@pytest.mark.parametrize("member", [
    _special(f"release/{LSA}/README.md", tarfile.SYMTYPE, linkname="/etc/hostname"),
    _special(f"release/{LSA}/README.md", tarfile.LNKTYPE, linkname="release/index.json"),
    _special(f"release/{LSA}/README.md", tarfile.CHRTYPE, devmajor=1, devminor=3),
    _special(f"release/{LSA}/README.md", tarfile.BLKTYPE, devmajor=8, devminor=0),
    _special(f"release/{LSA}/README.md", tarfile.FIFOTYPE),
    _special(f"release/{LSA}/README.md", tarfile.CONTTYPE),
    _special(f"release/{LSA}/sub", tarfile.DIRTYPE),
    _special(f"release/{LSA}/sub/x.json", tarfile.REGTYPE),
    _special("release/../../escaped.json", tarfile.REGTYPE),
    _special("/release/abs.json", tarfile.REGTYPE),
    _special("elsewhere/index.json", tarfile.REGTYPE),
    _special("release", tarfile.REGTYPE),
], ids=lambda m: f"{m.type!r}:{m.name}")
def test_a_member_that_is_not_a_plain_file_under_release_is_refused(shipped, tmp_path, monkeypatch, member):
    members = [(k, v) for k, v in members_of(shipped).items() if k != f"release/{LSA}/README.md"]
    members.append((member, b"{}" if member.type in (tarfile.REGTYPE, tarfile.CONTTYPE) else None))
    archive = tar_gz(tmp_path / "evil.tar.gz", members)
    no_extraction(monkeypatch)
    with pytest.raises(release.ReleaseError, match="refusing archive member") as e:
        release.unpack_archive(archive, tmp_path / "out" / "release", adopt_index=True)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "out").exists() and not (tmp_path / "escaped.json").exists()


def test_a_file_that_is_also_a_folder_and_trailing_data_are_refused(shipped, tmp_path):
    members = {**members_of(shipped), f"release/{LSA}": b"x"}
    with pytest.raises(release.ReleaseError, match="both a file and a folder"):
        release.unpack_archive(tar_gz(tmp_path / "clash.tar.gz", members), tmp_path / "out" / "release")
    good = release.write_archive(shipped, tmp_path / "good.tar.gz")
    with gzip.open(good) as f:
        raw = f.read()
    (tmp_path / "trailing.tar.gz").write_bytes(gzip.compress(raw + header("release/extra.json", 2, b"{}")))
    with pytest.raises(release.ReleaseError, match="data after the end of its tar archive"):
        release.unpack_archive(tmp_path / "trailing.tar.gz", tmp_path / "out" / "release")
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- (c) size caps, before extracting anything
@pytest.mark.parametrize("bomb", ["declared", "gnu-sparse"])
def test_a_huge_member_is_refused_from_its_header(shipped, tmp_path, monkeypatch, bomb):
    index = (shipped / release.INDEX_JSON).read_bytes()
    name = f"release/{LSA}/model.safetensors"
    huge = header(name, GIB16, b"\0" * 1024) if bomb == "declared" else gnu_sparse_header(name, GIB16) + b"\0" * 512
    archive = tmp_path / "bomb.tar.gz"
    archive.write_bytes(gzip.compress(header("release/index.json", len(index), index) + huge))  # truncated stream
    assert archive.stat().st_size < 50_000
    no_extraction(monkeypatch)
    with pytest.raises(release.ReleaseError, match=f"declares {GIB16} bytes, over MAX_MEMBER_BYTES = "
                                                   f"{release.MAX_MEMBER_BYTES}") as e:
        release.unpack_archive(archive, tmp_path / "out" / "release", adopt_index=True)
    assert str(archive) in str(e.value) and name in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()


def test_sparse_members_and_huge_extended_headers_are_refused(shipped, tmp_path, monkeypatch):
    no_extraction(monkeypatch)
    small_sparse = tmp_path / "sparse.tar.gz"
    small_sparse.write_bytes(gzip.compress(gnu_sparse_header("release/x.json", 1024) + b"\0" * 512 + b"\0" * 1024))
    with pytest.raises(release.ReleaseError, match="a sparse file"):
        release.unpack_archive(small_sparse, tmp_path / "out" / "release")
    pax = tarfile.TarInfo("././@PaxHeader")  # an extended header declaring 16 GiB of records
    pax.type = tarfile.XHDTYPE
    pax.size = GIB16
    pax_bomb = tmp_path / "pax.tar.gz"
    pax_bomb.write_bytes(gzip.compress(pax.tobuf(format=tarfile.GNU_FORMAT) + b"1 x\n" * 256))
    with pytest.raises(release.ReleaseError, match="MAX_TAR_STREAM"):
        release.unpack_archive(pax_bomb, tmp_path / "out" / "release")
    assert not (tmp_path / "out").exists()


def test_the_total_and_the_member_count_are_capped(shipped, tmp_path, monkeypatch):
    archive = release.write_archive(shipped, tmp_path / "release.tar.gz")
    no_extraction(monkeypatch)
    monkeypatch.setattr(release_archive, "MAX_ARCHIVE_BYTES", 100_000)
    with pytest.raises(release.ReleaseError, match="over MAX_ARCHIVE_BYTES = 100000"):
        release.unpack_archive(archive, tmp_path / "out" / "release")
    monkeypatch.setattr(release_archive, "MAX_ARCHIVE_BYTES", 64 * 2**20)
    monkeypatch.setattr(release_archive, "MAX_MEMBERS", 3)
    with pytest.raises(release.ReleaseError, match="more than MAX_MEMBERS = 3"):
        release.unpack_archive(archive, tmp_path / "out" / "release")


def test_the_real_release_fits_the_caps():
    sizes = [p.stat().st_size for p in release.release_dir().rglob("*") if p.is_file() and ".work" not in p.parts]
    assert max(sizes) < release.MAX_MEMBER_BYTES / 4 and sum(sizes) < release.MAX_ARCHIVE_BYTES * 0.75
    assert len(sizes) < release.MAX_MEMBERS / 2


# ---------------------------------------------------------------- (d) not an archive: one line
@pytest.mark.parametrize("kind", ["zip", "truncated", "plain-tar", "not-gzip", "empty", "missing", "folder"])
def test_what_is_not_a_release_archive_fails_in_one_line(shipped, tmp_path, kind, capsys):
    bad = tmp_path / "bad.tar.gz"
    if kind == "zip":
        with zipfile.ZipFile(bad, "w") as z:
            z.writestr("release/index.json", "{}")
    elif kind == "truncated":
        good = release.write_archive(shipped, tmp_path / "good.tar.gz").read_bytes()
        bad.write_bytes(good[: len(good) // 2])
    elif kind == "plain-tar":
        with tarfile.open(bad, "w") as tar:
            tar.add(shipped / release.INDEX_JSON, arcname="release/index.json")
    elif kind == "not-gzip":
        bad.write_bytes(b"hello, this is not an archive\n" * 40)
    elif kind == "empty":
        bad.write_bytes(b"")
    elif kind == "folder":
        bad.mkdir()
    dest = tmp_path / "out" / "release"
    with pytest.raises(release.ReleaseError, match="not a release archive") as e:
        release.unpack_archive(bad, dest)
    message = str(e.value)
    assert message.startswith(f"{bad}: not a release archive (expected a .tar.gz written by `zoo release archive`)")
    assert "\n" not in message and not (tmp_path / "out").exists()
    assert main(["release", "unpack", str(bad), "--root", str(dest)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err


# ---------------------------------------------------------------- (4) dest changes whole or not at all
def test_a_refused_archive_or_a_failed_move_leaves_dest_as_it_was(shipped, tmp_path, monkeypatch):
    dest = tmp_path / "dest"
    shutil.copytree(shipped, dest)
    (dest / LSA / "README.md").write_text("# local edit\n")
    before = tree(dest)
    bad = tampered(members_of(shipped), rewrite_index=False)
    with pytest.raises(release.ReleaseError):
        release.unpack_archive(tar_gz(tmp_path / "bad.tar.gz", bad), dest)
    assert tree(dest) == before

    archive = release.write_archive(shipped, tmp_path / "good.tar.gz")
    real_replace, calls = release_archive.os.replace, []

    def failing_third_move(src, dst):
        calls.append((src, dst))
        if len(calls) == 3:
            raise OSError("disk went away")
        return real_replace(src, dst)

    monkeypatch.setattr(release_archive.os, "replace", failing_third_move)
    with pytest.raises(OSError, match="disk went away"):
        release.unpack_archive(archive, dest)
    monkeypatch.setattr(release_archive.os, "replace", real_replace)
    assert tree(dest) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.tar.gz", "dest", "good.tar.gz", "shipped"]
    release.unpack_archive(archive, dest)
    assert tree(dest) != before and (dest / LSA / "README.md").read_bytes() == (shipped / LSA / "README.md").read_bytes()
