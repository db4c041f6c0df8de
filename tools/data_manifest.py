"""Rewrite bertscope/data/manifest.json from a data folder (a maintainer's tool, not the user's).

    python tools/data_manifest.py DATA_DIR [--out FILE]

Every file of each set's folder (bertscope.data.manifest.SETS) is listed with its size and
sha256; a note (SOURCE) also with its text, which `bertscope data download` writes since no home
serves it. A file that no source of its set claims is an error: the homes in
bertscope/data/manifest.py must say where every file comes from before the manifest lists it.
Run it when a data set is updated in ../shared/data, after pinning the new commit there.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
from pathlib import Path

from bertscope.data.manifest import MANIFEST_JSON, SETS

log = logging.getLogger("bertscope.tools.data_manifest")


def describe(folder: Path, name: str) -> dict:
    """path -> {size, sha256[, text]} for every file under one set's folder."""
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        data = path.read_bytes()
        entry = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        if SETS[name].source_of(rel) is None:  # a note: no home serves it
            entry["text"] = data.decode("utf-8")
        files[rel] = entry
    return files


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data_dir", type=Path, help="a complete data folder (e.g. ../shared/data)")
    p.add_argument("--out", type=Path, default=MANIFEST_JSON, help=f"the JSON to write (default: {MANIFEST_JSON})")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sets = {}
    for name in SETS:
        folder = args.data_dir / name
        if not folder.is_dir():
            log.error("%s: no folder %s", name, folder)
            return 1
        sets[name] = describe(folder, name)
        log.info("%-18s %4d files, %6.1f MB", name, len(sets[name]), sum(f["size"] for f in sets[name].values()) / 1e6)
    manifest = {"about": "written by tools/data_manifest.py from a data folder: each set's files, "
                         "sizes and sha256; the homes are in bertscope/data/manifest.py",
                "sets": sets}
    args.out.write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    log.info("wrote %s", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
