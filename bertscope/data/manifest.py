"""Where each annotated data set comes from, under which licence, and what its files must be.

Two halves. This module holds what a person checked by hand: each set's public home (a GitHub
repository at a pinned commit, or an archive in one), how the home's paths map to the files of
the set's folder, and the licence. `manifest.json` beside it holds what a script computed:
every file's path in the folder, size and sha256 (`python tools/data_manifest.py DATA_DIR`
rewrites it from a data folder, e.g. ../shared/data). `bertscope data download` reads both: it
fetches each file from its home and refuses any whose bytes differ from the manifest's.

The homes were checked against ../shared/data: every file listed here has the same git blob at
the pinned commit (the NLTK archives: the same bytes once extracted).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

MANIFEST_JSON = Path(__file__).with_name("manifest.json")

# Files are fetched as raw.githubusercontent.com/<owner>/<name>/<commit>/<path>; tests point this
# at a local server (the module attribute is read at every call)
GITHUB_RAW = "https://raw.githubusercontent.com"

# Notes of the data folder itself (where each file came from): no home has them, so the manifest
# carries their text and `download` writes it
NOTES = ("SOURCE",)


@dataclass(frozen=True)
class Source:
    """Files of a set from one place: the set's file `local` (a name; or a folder ending in "/";
    or "" for every file no other source claims) is `remote` (the same kind of path) in
    `repository` at `commit`; or, with `archive`, the member `remote` of that zip file."""

    local: str
    repository: str
    commit: str
    remote: str = ""
    archive: str | None = None

    def claims(self, path: str) -> bool:
        return path == self.local or (self.local.endswith("/") or not self.local) and path.startswith(self.local)

    def remote_path(self, path: str) -> str:
        """Where `path` (a file of the set's folder) is at the home: in the repository, or the
        archive member's name."""
        return self.remote if path == self.local else self.remote + path[len(self.local):]

    def url(self, path: str | None = None) -> str:
        """The URL of the file that holds `path`: the archive, or the file itself."""
        target = self.archive or self.remote_path(path)
        return f"{GITHUB_RAW}/{self.repository}/{self.commit}/{target}"


@dataclass(frozen=True)
class DataSet:
    name: str
    home: str  # in words, for the listing and the log
    licence: str  # the line printed before a download
    sources: tuple[Source, ...]

    def source_of(self, path: str) -> Source | None:
        """The source of a file of this set (the most specific claim), None for a note."""
        if path in NOTES:
            return None
        claims = [s for s in self.sources if s.claims(path)]
        if not claims:
            raise KeyError(f"{self.name}: no source for {path}")
        return max(claims, key=lambda s: len(s.local))


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative to the set's folder, "/"-separated
    size: int
    sha256: str
    text: str | None = None  # a note's content (NOTES), written as UTF-8


EWT = "UniversalDependencies/UD_English-EWT", "15d613d8447b3478787d4c278730a1e48a945efb"
GUM = "UniversalDependencies/UD_English-GUM", "afb41ee9bca57991125814fa04d96a0e61470c8b"
GAP = "google-research-datasets/gap-coreference", "83135f26025cdd705c04f77e940d0c9201116b80"
# the head of nltk_data's gh-pages branch (2023-02-02), the branch NLTK's downloader reads;
# rte.zip and rte.xml are unchanged there since 2012, the
# sentence_polarity files since 2015
NLTK = "nltk/nltk_data", "5db857e6f7df11eabb5e5665836db9ec8df07e28"
ARCT = "UKPLab/argument-reasoning-comprehension-task", "929f5847487e28036e60803f72e26a82c638db43"
ARCT2 = "IKMLab/arct2", "2eb4502f5a787665cae7195552cca74b05a0e900"

SETS = {s.name: s for s in (
    DataSet("ud-ewt", f"github.com/{EWT[0]} at {EWT[1][:10]} (2025-05-10)",
            "CC BY-SA 4.0 (ud-ewt/LICENSE.txt)",
            (Source("", *EWT),)),
    DataSet("gum", f"github.com/{GUM[0]} at {GUM[1][:10]} (2025-05-10), not-to-release/sources/",
            "CC BY 4.0 for the 160 documents here (Wikimedia, OpenStax, vlogs, speeches, conversations); "
            "the corpus as a whole is CC BY-NC-SA 4.0 (gum/LICENSE.txt)",
            (Source("docs/", *GUM, "not-to-release/sources/"), Source("LICENSE.txt", *GUM, "LICENSE.txt"))),
    DataSet("gap", f"github.com/{GAP[0]} at {GAP[1][:10]} (2018-10-30)",
            "Apache-2.0 (gap/LICENSE)",
            (Source("", *GAP),)),
    DataSet("rte", f"NLTK data, github.com/{NLTK[0]} at {NLTK[1][:10]}, packages/corpora/rte.zip",
            "research use, as distributed with NLTK data: cite the RTE challenges (rte/README)",
            (Source("", *NLTK, "rte/", archive="packages/corpora/rte.zip"),
             Source("nltk-package.xml", *NLTK, "packages/corpora/rte.xml"))),
    DataSet("sentence_polarity",
            f"NLTK data, github.com/{NLTK[0]} at {NLTK[1][:10]}, packages/corpora/sentence_polarity.zip",
            "CC BY 4.0, Bo Pang and Lillian Lee (sentence_polarity/README.txt)",
            (Source("", *NLTK, "sentence_polarity/", archive="packages/corpora/sentence_polarity.zip"),
             Source("nltk-package.xml", *NLTK, "packages/corpora/sentence_polarity.xml"))),
    DataSet("arct", f"github.com/{ARCT[0]} at {ARCT[1][:10]} (original) and github.com/{ARCT2[0]} at "
            f"{ARCT2[1][:10]} (adversarial)",
            "Apache-2.0 (arct/LICENSE); the adversarial set is derived from it",
            (Source("original/", *ARCT, "experiments/src/main/python/data/"), Source("LICENSE", *ARCT, "LICENSE"),
             Source("adversarial/", *ARCT2, "adversarial_dataset/"))),
)}


def load_files(path: Path = MANIFEST_JSON) -> dict[str, list[FileEntry]]:
    """Each set's files, as the JSON half lists them (sorted by path)."""
    sets = json.loads(path.read_text(encoding="utf-8"))["sets"]
    return {name: [FileEntry(p, **entry) for p, entry in sorted(files.items())] for name, files in sets.items()}
