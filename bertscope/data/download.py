"""`bertscope data download`: fetch the annotated data sets from their public homes, verified.

Every file is checked against the manifest (`bertscope.data.manifest`: its size and sha256, as
in ../shared/data) before it gets its final name, so a folder never holds a file that is half
written or not the one the analyses were checked on:

- a file is streamed into `<file>.part`, then checked, then renamed (atomic on one file system);
- an interrupted download keeps its `.part` and the next run asks only for the rest (HTTP
  Range); a server that ignores Range sends it all again. A file whose bytes turn out wrong
  loses its `.part`;
- the NLTK sets come as zip archives: the archive is fetched the same way, every member is
  checked to stay inside the data folder (no absolute paths, no `..` out of it, no links) before
  any is read, and each file of the set is then written from its member and checked;
- BERTSCOPE_DATA_MIRROR=URL reads every file from URL/<set>/<path in the set's folder> instead
  (a copy of a data folder served over HTTP: for tests, proxies and offline mirrors).

Only the standard library speaks HTTP (urllib); the progress bar is tqdm's.
"""
from __future__ import annotations

import hashlib
import http.client
import logging
import os
import stat
import tarfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from tqdm import tqdm

from bertscope.data import paths as data
from bertscope.data.manifest import SETS, FileEntry, Source, load_files
from bertscope.data.paths import DATASETS, given_data_dir
from bertscope.errors import UserError

log = logging.getLogger(__name__)

MIRROR_ENV = "BERTSCOPE_DATA_MIRROR"
CHUNK = 1 << 16
TIMEOUT_S = 60


def download_root(data_dir: str | None = None) -> Path:
    """Where `download` writes: --data-dir, else BERTSCOPE_DATA, else the user data folder; the
    first place `bertscope.data.paths` looks, so what is downloaded is what is found."""
    given = given_data_dir(data_dir)
    root = given[0] if given else data.user_data_dir()
    if root.exists() and not root.is_dir():
        raise UserError(f"cannot download into {root}: it is not a directory")
    return root


def resolve_names(names) -> list[str]:
    """The sets asked for, in the manifest's order; none or "all" means every one."""
    names = list(names or ["all"])
    if "all" in names:
        return list(SETS)
    unknown = [n for n in names if n not in SETS]
    if unknown:
        raise UserError(f"unknown data set {unknown[0]!r}: choose from {', '.join(SETS)} or all")
    return [n for n in SETS if n in names]


def download(names=None, data_dir: str | None = None, mirror: str | None = None, progress: bool = True,
             files: dict[str, list[FileEntry]] | None = None) -> Path:
    """Fetch the named sets (default: all) into the download root and return it. `mirror`
    defaults to $BERTSCOPE_DATA_MIRROR; `files`, to the manifest's JSON half."""
    names = resolve_names(names)
    root = download_root(data_dir)
    mirror = mirror if mirror is not None else os.environ.get(MIRROR_ENV) or None
    files = files if files is not None else load_files()
    for name in names:
        download_set(name, files[name], root, mirror, progress)
    return root


def download_set(name: str, entries: list[FileEntry], root: Path, mirror: str | None, progress: bool):
    """One set: log its home and licence once, then fetch each file not already there intact."""
    dataset, folder = SETS[name], root / name
    log.info("%s: %s", name, mirror or dataset.home)
    log.info("%s: licence: %s", name, dataset.licence)
    todo = [e for e in entries if not is_intact(folder / e.path, e)]
    if not todo:
        log.info("%s: all %d files already there, checked", name, len(entries))
        return
    with tqdm(total=sum(e.size for e in todo), unit="B", unit_scale=True, desc=name, disable=not progress,
              leave=False) as bar:
        archives: dict[Source, list[FileEntry]] = {}
        for entry in todo:
            source = dataset.source_of(entry.path)
            if mirror:
                url = f"{mirror.rstrip('/')}/{urllib.parse.quote(name)}/{urllib.parse.quote(entry.path)}"
                fetch(url, folder / entry.path, entry, bar)
            elif source is None:
                write_note(folder / entry.path, entry)
                bar.update(entry.size)
            elif source.archive:
                archives.setdefault(source, []).append(entry)
            else:
                fetch(source.url(entry.path), folder / entry.path, entry, bar)
        for source, members in archives.items():
            from_archive(source, members, root, folder, bar)
    log.info("%s: %d files written, %d already there", name, len(todo), len(entries) - len(todo))
    check_findable(name, root)


def check_findable(name: str, root: Path):
    """The reader's check (bertscope.data.paths) on what was just written: a manifest that lists the
    wrong files would otherwise pass unnoticed until an analysis runs."""
    folder, expected, what = DATASETS[name]
    if not any((root / folder).glob(expected)):
        raise UserError(f"{what}: the download holds no {expected} in {root / folder}")


def is_intact(path: Path, entry: FileEntry) -> bool:
    """Whether the file is there with the manifest's bytes (hashing 24 MB takes well under a
    second, and a damaged file is then replaced rather than trusted)."""
    if not path.is_file():
        return False
    if path.stat().st_size == entry.size and sha256_of(path).hexdigest() == entry.sha256:
        return True
    log.warning("%s differs from the manifest: downloading it again", path)
    return False


def sha256_of(path: Path, digest=None):
    """The sha256 object of a file's bytes (fed into `digest` when given)."""
    digest = digest or hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest


def write_note(path: Path, entry: FileEntry):
    """A note of the data folder (SOURCE), written from the manifest's copy."""
    data = entry.text.encode("utf-8")
    part = path.with_name(path.name + ".part")
    part.parent.mkdir(parents=True, exist_ok=True)
    part.write_bytes(data)
    verify(part, entry, hashlib.sha256(data), len(data), "the manifest")
    os.replace(part, path)


def verify(part: Path, entry: FileEntry, digest, size: int, origin: str):
    """Size and sha256 as the manifest says, or the .part goes and a UserError says which file."""
    if size != entry.size or digest.hexdigest() != entry.sha256:
        part.unlink(missing_ok=True)
        raise UserError(f"checksum mismatch for {entry.path} from {origin}: expected {entry.size} bytes with "
                        f"sha256 {entry.sha256[:12]}..., got {size} bytes with {digest.hexdigest()[:12]}...")


def fetch(url: str, path: Path, entry: FileEntry | None, bar) -> Path:
    """Download `url` to `path` through `path.part`, resuming a .part left by an earlier run.
    With an `entry`, the bytes must match it before the rename; without one (an archive, which
    is checked member by member), the length the server announced must arrive."""
    part = path.with_name(path.name + ".part")
    part.parent.mkdir(parents=True, exist_ok=True)
    have = part.stat().st_size if part.is_file() else 0
    if entry is not None and have > entry.size:
        part.unlink()
        have = 0
    digest = sha256_of(part) if have else hashlib.sha256()
    if entry is None or have < entry.size:
        have, digest = _stream(url, part, have, digest, bar)
    if entry is not None:
        verify(part, entry, digest, have, url)
    os.replace(part, path)
    return path


def _stream(url: str, part: Path, have: int, digest, bar):
    """Append the rest of `url` to `part` (from byte `have`); (bytes in part, digest)."""
    request = urllib.request.Request(url, headers={"User-Agent": "bertscope"})
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            total = None
            if have and response.status == 206:
                content_range = response.headers.get("Content-Range") or ""
                if not content_range.startswith(f"bytes {have}-"):
                    raise ValueError(f"asked for bytes {have}- and got {content_range or 'no Content-Range'}")
                total = _range_total(content_range)
                bar.update(have)
            else:  # the whole file: what the .part held goes
                have, digest = 0, hashlib.sha256()
                length = response.headers.get("Content-Length")
                total = int(length) if length and length.isdigit() else None
            if bar.total is None and total:  # an archive: its size is known only now
                bar.total = total
                bar.refresh()
            with open(part, "ab" if have else "wb") as out:
                for block in iter(lambda: response.read(CHUNK), b""):
                    out.write(block)
                    digest.update(block)
                    have += len(block)
                    bar.update(len(block))
    except urllib.error.HTTPError as e:
        if e.code == 416 and have and _range_total(e.headers.get("Content-Range")) == have:
            return have, digest  # the .part already holds all of it
        raise UserError(f"cannot download {url}: HTTP {e.code} {e.reason}") from None
    except (OSError, http.client.HTTPException, ValueError) as e:  # URLError is an OSError
        reason = getattr(e, "reason", None) or e
        raise UserError(f"cannot download {url}: {_one_line(reason)}") from None
    if total is not None and have != total:
        raise UserError(f"cannot download {url}: the connection ended after {have} of {total} bytes "
                        "(run the command again to resume)")
    return have, digest


def _range_total(content_range: str | None) -> int | None:
    """The full length in a Content-Range header ("bytes 100-199/200", "bytes */200")."""
    total = (content_range or "").rpartition("/")[2].strip()
    return int(total) if total.isdigit() else None


def _one_line(reason) -> str:
    return " ".join(str(reason).split()) or type(reason).__name__


def from_archive(source: Source, entries: list[FileEntry], root: Path, folder: Path, bar):
    """Fetch the archive of `source`, check all its members, write each entry from its member."""
    url = source.url()
    with tqdm(unit="B", unit_scale=True, desc=PurePosixPath(source.archive).name, disable=bar.disable,
              leave=False) as archive_bar:
        archive = fetch(url, root / ".downloads" / PurePosixPath(source.archive).name, None, archive_bar)
    try:
        with open_archive(archive) as (members, open_member):
            for name, kind in members.items():
                check_member(name, kind, root, url)
            for entry in entries:
                member = source.remote_path(entry.path)
                if member not in members:
                    raise UserError(f"{url} has no member {member} (for {folder.name}/{entry.path})")
                target = folder / entry.path
                part = target.with_name(target.name + ".part")
                part.parent.mkdir(parents=True, exist_ok=True)
                digest, size = hashlib.sha256(), 0
                with open_member(member) as src, open(part, "wb") as out:
                    for block in iter(lambda: src.read(CHUNK), b""):
                        out.write(block)
                        digest.update(block)
                        size += len(block)
                verify(part, entry, digest, size, f"{url} ({member})")
                os.replace(part, target)
                bar.update(size)
    except (zipfile.BadZipFile, tarfile.TarError, EOFError) as e:
        raise UserError(f"cannot read the archive from {url}: {_one_line(e)}") from None
    finally:  # a bad or used archive is not kept: the next run fetches it anew
        archive.unlink(missing_ok=True)
        try:
            archive.parent.rmdir()
        except OSError:
            pass


@contextmanager
def open_archive(path: Path):
    """A zip or tar archive as (name -> kind: "file", "dir" or "link", open(name) -> stream)."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            kinds = {}
            for info in z.infolist():
                mode = info.external_attr >> 16  # Unix mode bits, where the zip was made on Unix
                kinds[info.filename] = "link" if stat.S_ISLNK(mode) else "dir" if info.is_dir() else "file"
            yield kinds, z.open
    else:
        with tarfile.open(path) as t:
            yield {m.name: "file" if m.isfile() else "dir" if m.isdir() else "link" for m in t.getmembers()}, \
                t.extractfile


def check_member(name: str, kind: str, root: Path, url: str):
    """Refuse an archive whose member could land outside `root` if extracted: an absolute
    path, one that `..` leads out of it, a link or device."""
    if kind == "link":
        raise UserError(f"refusing the archive from {url}: member {name!r} is a link or special file")
    if name.startswith(("/", "\\")) or PurePosixPath(name).is_absolute() or (len(name) > 1 and name[1] == ":"):
        raise UserError(f"refusing the archive from {url}: member {name!r} has an absolute path")
    base = root.resolve()
    if not (base / name).resolve().is_relative_to(base):
        raise UserError(f"refusing the archive from {url}: member {name!r} leaves the data folder")
