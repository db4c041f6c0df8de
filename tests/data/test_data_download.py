"""`bertscope data download`: every file checked against the manifest, through a real HTTP server.

The server is `http.server` in a thread on 127.0.0.1, with a handler that honours `Range`
(SimpleHTTPRequestHandler does not), so resuming is tested as a real client meets it. The homes
(GitHub, NLTK data) are replaced by the same server: `data_manifest.GITHUB_RAW` points at it and
the folder it serves is laid out as owner/name/commit/path. Never the internet. Error paths use a
small made-up manifest, so they run without the shared data; the byte-for-byte checks read
../shared/data and skip without it.
"""
from __future__ import annotations

import functools
import hashlib
import io
import re
import socket
import tarfile
import threading
import zipfile
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from bertscope.cli.main import main
from bertscope.data import manifest as data_manifest
from bertscope.data import paths as data
from bertscope.data.download import MIRROR_ENV, check_member, download, open_archive
from bertscope.data.manifest import NOTES, SETS, FileEntry, load_files
from bertscope.data.paths import DATASETS
from bertscope.errors import UserError


class RangeHandler(SimpleHTTPRequestHandler):
    """Files of a folder, with `Range: bytes=N-` answered by 206 (or 416 past the end); every
    request's path and Range header is recorded in `requests`."""

    requests: ClassVar[list] = []  # each server gets a subclass with its own list
    ranges = True
    cut: int | None = None  # send only this many bytes of a whole file, then hang up

    def send_head(self):
        self.requests.append((self.path, self.headers.get("Range")))
        wanted = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
        path = Path(self.translate_path(self.path))
        if self.cut is not None and not wanted and path.is_file():
            content = path.read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.close_connection = True
            return io.BytesIO(content[:self.cut])
        if not (self.ranges and wanted and path.is_file()):
            return super().send_head()
        start, size = int(wanted.group(1)), path.stat().st_size
        if start >= size:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.end_headers()
            return None
        f = open(path, "rb")
        f.seek(start)
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        self.send_header("Content-Length", str(size - start))
        self.end_headers()
        return f

    def log_message(self, *args):  # no request lines in the test output
        pass


@pytest.fixture
def serve():
    """serve(folder, ranges=True) -> base URL of a server on a free local port, for this test."""
    servers = []

    def start(folder: Path, ranges: bool = True) -> str:
        handler = type("Handler", (RangeHandler,), {"requests": [], "ranges": ranges})
        server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(folder)))
        server.handler = handler
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    start.servers = servers
    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture(autouse=True)
def no_mirror_and_own_user_folder(monkeypatch, tmp_path):
    """No mirror from the shell, and a user data folder of the test's own."""
    monkeypatch.delenv(MIRROR_ENV, raising=False)
    monkeypatch.delenv("BERTSCOPE_DATA", raising=False)
    monkeypatch.setattr(data, "user_data_dir", lambda: tmp_path / "user-data")


@pytest.fixture(scope="module")
def shared() -> Path:
    """A complete data folder, found as the analyses find it (BERTSCOPE_DATA, ../shared/data)."""
    try:
        path = data.data_root()
    except UserError as error:
        pytest.skip(str(error))
    if not all((path / name).is_dir() for name in SETS):
        pytest.skip(f"no complete data folder at {path}")
    return path


def entry(path: str, content: bytes) -> FileEntry:
    return FileEntry(path, len(content), hashlib.sha256(content).hexdigest())


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def final_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and not p.name.endswith(".part")] if folder.exists() else []


# --- the manifest -----------------------------------------------------------------------------


def test_manifest_covers_every_data_set_with_pinned_homes():
    files = load_files()
    assert list(SETS) == list(DATASETS) == list(files)
    for name, entries in files.items():
        for e in entries:
            source = SETS[name].source_of(e.path)
            if source is None:
                assert e.path in NOTES and e.text.encode() and len(e.text.encode()) == e.size
            else:
                assert re.fullmatch(r"[0-9a-f]{40}", source.commit), source
                assert source.url(e.path).startswith(f"{data_manifest.GITHUB_RAW}/{source.repository}/{source.commit}/")
    gum = {e.path: SETS["gum"].source_of(e.path).remote_path(e.path) for e in files["gum"] if e.path != "SOURCE"}
    assert gum["docs/GUM_bio_byron.conllu"] == "not-to-release/sources/GUM_bio_byron.conllu"
    assert gum["LICENSE.txt"] == "LICENSE.txt"
    rte = SETS["rte"]
    assert rte.source_of("rte1_dev.xml").archive == "packages/corpora/rte.zip"
    assert rte.source_of("rte1_dev.xml").remote_path("rte1_dev.xml") == "rte/rte1_dev.xml"
    assert rte.source_of("nltk-package.xml").url("nltk-package.xml").endswith("packages/corpora/rte.xml")


def test_manifest_matches_the_shared_data(shared):
    """What tools/data_manifest.py would write from ../shared/data is what the JSON holds."""
    for name, entries in load_files().items():
        on_disk = sorted(p.relative_to(shared / name).as_posix() for p in (shared / name).rglob("*") if p.is_file())
        assert [e.path for e in entries] == on_disk, name
        for e in entries:
            content = (shared / name / e.path).read_bytes()
            assert (len(content), hashlib.sha256(content).hexdigest()) == (e.size, e.sha256), e.path


# --- through the mirror -----------------------------------------------------------------------


def test_download_all_through_the_mirror_is_byte_identical(shared, serve, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(MIRROR_ENV, serve(shared))
    out = tmp_path / "data"
    assert main(["data", "download", "all", "--data-dir", str(out), "--quiet"]) == 0
    for name, entries in load_files().items():
        for e in entries:
            assert (out / name / e.path).read_bytes() == (shared / name / e.path).read_bytes(), e.path
    assert not list(out.rglob("*.part")) and not (out / ".downloads").exists()
    printed = capsys.readouterr().out
    assert f"data folder: {out}" in printed and "MISSING" not in printed
    # a second run checks what is there and fetches nothing
    monkeypatch.setenv(MIRROR_ENV, f"http://127.0.0.1:{closed_port()}")
    assert main(["data", "download", "--data-dir", str(out)]) == 0
    assert "gum: licence: CC BY 4.0" in capsys.readouterr().out  # each set's licence, once per run


def test_download_goes_to_the_user_data_folder_which_is_then_found(tmp_path, serve, monkeypatch):
    content = b"# sent_id = 1\n1\tHi\thi\tINTJ\tUH\t_\t0\troot\t_\t_\n\n"
    files = {"ud-ewt": [entry("en_ewt-ud-dev.conllu", content)]}
    (tmp_path / "mirror" / "ud-ewt").mkdir(parents=True)
    (tmp_path / "mirror" / "ud-ewt" / "en_ewt-ud-dev.conllu").write_bytes(content)
    root = download(["ud-ewt"], mirror=serve(tmp_path / "mirror"), progress=False, files=files)
    assert root == tmp_path / "user-data"
    monkeypatch.setattr(data, "REPO_ROOT", tmp_path / "repo")  # no ../shared/data
    assert data.dataset_dir("ud-ewt") == root / "ud-ewt"
    assert data.data_root() == root


def test_an_unreachable_mirror_is_one_line_and_leaves_no_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(MIRROR_ENV, f"http://127.0.0.1:{closed_port()}")
    out = tmp_path / "data"
    assert main(["data", "download", "gap", "--data-dir", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bertscope: error: cannot download http://127.0.0.1:") and err.count("\n") == 1
    assert final_files(out) == [] and not list(out.rglob("*.part"))


def test_a_corrupted_file_fails_its_checksum_and_loses_its_part(tmp_path, serve):
    good = b"ID\tText\n" + b"x" * 5000
    (tmp_path / "mirror" / "gap").mkdir(parents=True)
    (tmp_path / "mirror" / "gap" / "gap-development.tsv").write_bytes(good[:-1] + b"y")  # one byte differs
    out = tmp_path / "data"
    with pytest.raises(UserError, match=r"^checksum mismatch for gap-development\.tsv from http://127\.0\.0\.1:\d+/gap/"):
        download(["gap"], out, mirror=serve(tmp_path / "mirror"), progress=False,
                 files={"gap": [entry("gap-development.tsv", good)]})
    assert final_files(out) == [] and not list(out.rglob("*.part"))


@pytest.mark.parametrize("ranges", [True, False], ids=["range", "no-range"])
def test_a_partial_download_resumes_to_the_right_bytes(tmp_path, serve, ranges):
    content = bytes(range(256)) * 800  # 204,800 bytes
    (tmp_path / "mirror" / "gap").mkdir(parents=True)
    (tmp_path / "mirror" / "gap" / "gap-development.tsv").write_bytes(content)
    folder = tmp_path / "data" / "gap"
    folder.mkdir(parents=True)
    half = len(content) // 2
    (folder / "gap-development.tsv.part").write_bytes(content[:half])
    url = serve(tmp_path / "mirror", ranges=ranges)
    download(["gap"], tmp_path / "data", mirror=url, progress=False,
             files={"gap": [entry("gap-development.tsv", content)]})
    assert (folder / "gap-development.tsv").read_bytes() == content
    assert not (folder / "gap-development.tsv.part").exists()
    assert serve.servers[0].handler.requests == [("/gap/gap-development.tsv", f"bytes={half}-")]


def test_a_dropped_connection_keeps_its_part_and_the_next_run_resumes(tmp_path, serve):
    content = bytes(range(256)) * 400
    (tmp_path / "mirror" / "gap").mkdir(parents=True)
    (tmp_path / "mirror" / "gap" / "gap-development.tsv").write_bytes(content)
    url = serve(tmp_path / "mirror")
    handler = serve.servers[0].handler
    handler.cut = 30000
    files = {"gap": [entry("gap-development.tsv", content)]}
    folder = tmp_path / "data" / "gap"
    with pytest.raises(UserError, match=r"^cannot download http://127\.0\.0\.1:\d+/gap/gap-development\.tsv: "):
        download(["gap"], tmp_path / "data", mirror=url, progress=False, files=files)
    assert final_files(folder) == []
    assert (folder / "gap-development.tsv.part").read_bytes() == content[:30000]
    handler.cut = None
    download(["gap"], tmp_path / "data", mirror=url, progress=False, files=files)
    assert (folder / "gap-development.tsv").read_bytes() == content
    assert handler.requests[-1] == ("/gap/gap-development.tsv", "bytes=30000-")


def test_a_part_with_wrong_bytes_is_dropped(tmp_path, serve):
    content = b"a" * 10000
    (tmp_path / "mirror" / "gap").mkdir(parents=True)
    (tmp_path / "mirror" / "gap" / "gap-development.tsv").write_bytes(content)
    folder = tmp_path / "data" / "gap"
    folder.mkdir(parents=True)
    (folder / "gap-development.tsv.part").write_bytes(b"b" * 5000)  # resumed onto bad bytes
    files = {"gap": [entry("gap-development.tsv", content)]}
    url = serve(tmp_path / "mirror")
    with pytest.raises(UserError, match="checksum mismatch"):
        download(["gap"], tmp_path / "data", mirror=url, progress=False, files=files)
    assert final_files(folder) == [] and not (folder / "gap-development.tsv.part").exists()
    download(["gap"], tmp_path / "data", mirror=url, progress=False, files=files)  # the next run starts afresh
    assert (folder / "gap-development.tsv").read_bytes() == content


def test_a_damaged_file_is_fetched_again(tmp_path, serve, caplog):
    content = b"b" * 1000
    (tmp_path / "mirror" / "gap").mkdir(parents=True)
    (tmp_path / "mirror" / "gap" / "gap-development.tsv").write_bytes(content)
    (tmp_path / "data" / "gap").mkdir(parents=True)
    (tmp_path / "data" / "gap" / "gap-development.tsv").write_bytes(b"truncated")
    download(["gap"], tmp_path / "data", mirror=serve(tmp_path / "mirror"), progress=False,
             files={"gap": [entry("gap-development.tsv", content)]})
    assert (tmp_path / "data" / "gap" / "gap-development.tsv").read_bytes() == content
    assert "differs from the manifest" in caplog.text


# --- from the homes: files by commit, and the NLTK archives ------------------------------------


def home_layout(root: Path, source, remote: str, content: bytes):
    """Put `content` where the fake raw.githubusercontent.com serves `remote` of `source`."""
    path = root / source.repository / source.commit / remote
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)


def nltk_zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("rte/", b"")
        for name, content in members.items():
            z.writestr(name, content)
    return buffer.getvalue()


def test_rte_from_its_nltk_archive_is_byte_identical(shared, serve, tmp_path, monkeypatch):
    """The archive is built from the shared files as NLTK's rte.zip holds them (rte/<file>),
    served where the home would be, downloaded, checked and extracted."""
    rte = SETS["rte"]
    archive_source = rte.source_of("rte1_dev.xml")
    entries = load_files()["rte"]
    members = {archive_source.remote_path(e.path): (shared / "rte" / e.path).read_bytes()
               for e in entries if rte.source_of(e.path) is archive_source}
    home = tmp_path / "home"
    home_layout(home, archive_source, archive_source.archive, nltk_zip(members))
    xml = rte.source_of("nltk-package.xml")
    home_layout(home, xml, xml.remote, (shared / "rte" / "nltk-package.xml").read_bytes())
    monkeypatch.setattr(data_manifest, "GITHUB_RAW", serve(home))
    out = tmp_path / "data"
    assert main(["data", "download", "rte", "--data-dir", str(out), "--quiet"]) == 0
    for e in entries:  # SOURCE included: written from the manifest
        assert (out / "rte" / e.path).read_bytes() == (shared / "rte" / e.path).read_bytes(), e.path
    assert sorted(p.name for p in (out / "rte").iterdir()) == sorted(e.path for e in entries)
    assert not (out / ".downloads").exists()  # the archive is not kept


def test_files_come_from_their_repository_at_the_pinned_commit(tmp_path, serve, monkeypatch):
    """ARCT's files come from two repositories; each is asked for at its commit and path."""
    arct = SETS["arct"]
    contents = {"original/train.tsv": b"#id\tclaim\n1\tc\n", "adversarial/claim_map.csv": b"a\tb\n",
                "LICENSE": b"Apache\n"}
    home = tmp_path / "home"
    for path, content in contents.items():
        source = arct.source_of(path)
        home_layout(home, source, source.remote_path(path), content)
    monkeypatch.setattr(data_manifest, "GITHUB_RAW", serve(home))
    download(["arct"], tmp_path / "data", progress=False,
             files={"arct": [entry(p, c) for p, c in contents.items()]})
    for path, content in contents.items():
        assert (tmp_path / "data" / "arct" / path).read_bytes() == content
    asked = sorted(p for p, _ in serve.servers[0].handler.requests)
    assert asked == sorted([
        f"/UKPLab/argument-reasoning-comprehension-task/{data_manifest.ARCT[1]}/LICENSE",
        f"/IKMLab/arct2/{data_manifest.ARCT2[1]}/adversarial_dataset/claim_map.csv",
        f"/UKPLab/argument-reasoning-comprehension-task/{data_manifest.ARCT[1]}/experiments/src/main/python/data/train.tsv",
    ])


@pytest.mark.parametrize("bad", ["../evil.txt", "rte/../../evil.txt", "/tmp/evil.txt"])
def test_a_zip_member_outside_the_data_folder_is_refused(tmp_path, serve, monkeypatch, bad):
    good = b"<entailment-corpus/>"
    source = SETS["rte"].source_of("rte1_dev.xml")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("rte/rte1_dev.xml", good)
        z.writestr(zipfile.ZipInfo(bad), b"owned")
    home = tmp_path / "home"
    home_layout(home, source, source.archive, buffer.getvalue())
    monkeypatch.setattr(data_manifest, "GITHUB_RAW", serve(home))
    out = tmp_path / "work" / "data"
    with pytest.raises(UserError, match=r"^refusing the archive from http://127\.0\.0\.1:\d+/nltk/.*rte\.zip: member"):
        download(["rte"], out, progress=False, files={"rte": [entry("rte1_dev.xml", good)]})
    assert final_files(tmp_path / "work") == []  # nothing extracted, the archive gone
    assert not list(tmp_path.rglob("evil.txt"))


def test_a_zip_symlink_member_is_refused(tmp_path):
    info = zipfile.ZipInfo("rte/link")
    info.external_attr = 0o120777 << 16  # a symbolic link, as Info-ZIP stores one
    with zipfile.ZipFile(tmp_path / "a.zip", "w") as z:
        z.writestr(info, "/etc/passwd")
    with open_archive(tmp_path / "a.zip") as (members, _):
        assert members == {"rte/link": "link"}
    with pytest.raises(UserError, match="is a link"):
        check_member("rte/link", "link", tmp_path, "URL")


@pytest.mark.parametrize("bad, kind", [("../evil.txt", tarfile.REGTYPE), ("rte/link", tarfile.SYMTYPE),
                                       ("rte/hard", tarfile.LNKTYPE)])
def test_a_tar_member_outside_the_data_folder_or_a_link_is_refused(tmp_path, bad, kind):
    with tarfile.open(tmp_path / "a.tar.gz", "w:gz") as t:
        member = tarfile.TarInfo(bad)
        member.type, member.linkname = kind, "../../etc/passwd" if kind != tarfile.REGTYPE else ""
        t.addfile(member, io.BytesIO(b"") if kind == tarfile.REGTYPE else None)
    with open_archive(tmp_path / "a.tar.gz") as (members, _):
        ((name, found_kind),) = members.items()
    with pytest.raises(UserError, match="refusing the archive"):
        check_member(name, found_kind, tmp_path / "data", "URL")


def test_a_member_inside_the_folder_passes(tmp_path):
    check_member("rte/rte1_dev.xml", "file", tmp_path, "URL")
    check_member("rte/", "dir", tmp_path, "URL")
    check_member("rte/./x/../rte1_dev.xml", "file", tmp_path, "URL")


# --- the command line -------------------------------------------------------------------------


def test_an_unknown_set_is_a_one_line_user_error(tmp_path, capsys):
    assert main(["data", "download", "mnli", "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == "bertscope: error: unknown data set 'mnli': choose from " + ", ".join(SETS) + " or all\n"


def test_listing_names_the_command_that_gets_a_missing_set(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(data, "REPO_ROOT", tmp_path / "repo")  # no ../shared/data, no user folder
    assert main(["data"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("annotated data not found: run `bertscope data download`")
    assert "  gap                MISSING: get it with `bertscope data download gap`" in out
    (tmp_path / "d" / "rte").mkdir(parents=True)
    (tmp_path / "d" / "rte" / "rte1_dev.xml").write_text("x")
    assert main(["data", "list", "--data-dir", str(tmp_path / "d")]) == 1  # --data-dir after the subcommand
    out = capsys.readouterr().out
    assert f"rte                {tmp_path / 'd' / 'rte'}" in out
    assert f"get it with `bertscope data download gap --data-dir {tmp_path / 'd'}`" in out


def test_data_dir_before_the_subcommand_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv(MIRROR_ENV, f"http://127.0.0.1:{closed_port()}")
    assert main(["data", "--data-dir", str(tmp_path / "here"), "download", "gap", "--quiet"]) == 2
    assert (tmp_path / "here").exists() and not (tmp_path / "user-data").exists()


def test_a_file_as_the_download_folder_is_refused(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert main(["data", "download", "gap", "--data-dir", str(tmp_path / "file")]) == 2
    assert "is not a directory" in capsys.readouterr().err
