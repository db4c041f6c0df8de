"""`--model` with a Hugging Face Hub id, offline: a Hugging Face cache built in a temporary
folder from the embedded MiniLM's files, in the hub's own layout

    models--sentence-transformers--all-MiniLM-L6-v2/refs/main       the commit hash
    models--sentence-transformers--all-MiniLM-L6-v2/snapshots/<hash>/ the files (links)

read with HF_HUB_OFFLINE=1: the id must give exactly the statistics of the folder, run.json must
name the id and the commit, and every way of getting it wrong must be one line. A download is
tested against a stand-in for the Hub served on 127.0.0.1 (`fake_hub`); no test here reaches
the network.

huggingface_hub reads HF_HUB_CACHE and HF_HUB_OFFLINE once, when it is imported; the in-process
tests set its constants beside the environment, and one test runs the `bertscope` process
itself with the environment alone.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from bertscope.cli.main import main
from bertscope.errors import UserError
from bertscope.models.loading import load_model, model_name
from bertscope.models.source import looks_like_path, resolve_model

pytestmark = pytest.mark.usefixtures("single_thread")

HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"
COMMIT = "c9745ed1d9f207416be6d2e6f8de32d1f16199bf"  # any 40 hex digits: the cache's name for the snapshot
TAG_COMMIT = "0123456789abcdef0123456789abcdef01234567"
LINES = ["The cat sat on the mat.\tIt was happy, very happy.", "Mr. Smith went to Washington.\tHe liked it there.",
         "A single line, without any pair.", "Attention heads attend to the separator token, to periods and commas."]


REPO = "models--" + HUB_ID.replace("/", "--")  # the cache's folder of HUB_ID


def build_cache(cache: Path, model_dir: Path) -> Path:
    """A Hugging Face cache holding `model_dir`'s files as HUB_ID, main at COMMIT; returns the repo folder."""
    repo = cache / REPO
    add_snapshot(repo, COMMIT, model_dir, "main")
    return repo


def add_snapshot(repo: Path, commit: str, model_dir: Path, ref: str):
    """snapshots/<commit>/ with links to `model_dir`'s files, and refs/<ref> naming it."""
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for f in model_dir.iterdir():
        if f.is_file():
            (snapshot / f.name).symlink_to(f)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / ref).write_text(commit)  # as the hub writes it: no newline


@pytest.fixture
def hub_cache(tmp_path, minilm_path, monkeypatch) -> Path:
    """An offline Hugging Face cache with the embedded MiniLM as HUB_ID: main at COMMIT, tag v1 at TAG_COMMIT."""
    from huggingface_hub import constants

    cache = tmp_path / "hf" / "hub"
    add_snapshot(build_cache(cache, minilm_path), TAG_COMMIT, minilm_path, "v1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return path


def run_args(corpus: Path, out: Path, *model: str) -> list[str]:
    return ["run", *model, "--corpus", str(corpus), "--limit", "all", "--max-len", "32", "--out", str(out),
            "--no-figures", "--quiet"]


def one_line_error(capsys, code: int) -> str:
    """Exit code 2 and one line on stderr, no traceback; returns that line."""
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("bertscope: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


@pytest.fixture
def folder_run(tmp_path, corpus, minilm_path) -> Path:
    out = tmp_path / "folder"
    assert main(run_args(corpus, out, "--model", str(minilm_path))) == 0
    return out


def test_a_hub_id_gives_the_folders_statistics(hub_cache, folder_run, tmp_path, corpus):
    out = tmp_path / "by-id"
    assert main(run_args(corpus, out, "--model", HUB_ID)) == 0
    assert (out / "heads.csv").read_bytes() == (folder_run / "heads.csv").read_bytes()
    record = json.loads((out / "run.json").read_text())
    assert record["model"]["hub_id"] == HUB_ID
    assert record["model"]["revision"] == "main"
    assert record["model"]["commit"] == COMMIT
    assert Path(record["model"]["path"]).name == COMMIT
    assert record["settings"]["model"] == HUB_ID and record["settings"]["revision"] is None
    folder_model = json.loads((folder_run / "run.json").read_text())["model"]
    assert "hub_id" not in folder_model and "commit" not in folder_model  # a folder: its path, as before


def test_revision_by_commit_and_by_tag(hub_cache, folder_run, tmp_path, corpus):
    for revision, commit in ((COMMIT, COMMIT), ("v1", TAG_COMMIT)):
        out = tmp_path / f"rev-{revision}"
        assert main(run_args(corpus, out, "--model", HUB_ID, "--revision", revision)) == 0
        assert (out / "heads.csv").read_bytes() == (folder_run / "heads.csv").read_bytes()
        model = json.loads((out / "run.json").read_text())["model"]
        assert (model["revision"], model["commit"]) == (revision, commit)


def test_a_resumed_hub_run_keeps_its_commit(hub_cache, tmp_path, corpus, folder_run):
    """main moves after the run began: the resumed run still reads the commit it started with."""
    out = tmp_path / "moving"
    assert main(run_args(corpus, out, "--model", HUB_ID)) == 0
    (hub_cache / REPO / "refs" / "main").write_text("f" * 40)  # a commit this cache does not hold
    record = json.loads((out / "run.json").read_text())
    record["status"] = "running"
    (out / "run.json").write_text(json.dumps(record))
    assert main(["run", "--resume", str(out), "--no-figures", "--quiet"]) == 0
    model = json.loads((out / "run.json").read_text())["model"]
    assert (model["revision"], model["commit"]) == ("main", COMMIT)
    assert (out / "heads.csv").read_bytes() == (folder_run / "heads.csv").read_bytes()


def test_an_unknown_id_offline_is_one_line_that_says_how_to_get_it(hub_cache, tmp_path, corpus, capsys):
    line = one_line_error(capsys, main(run_args(corpus, tmp_path / "o", "--model", "no-org/no-such-model")))
    assert "no-org/no-such-model" in line and "HF_HUB_OFFLINE=1" in line
    assert "hf download no-org/no-such-model" in line and "network access" in line and "local folder" in line
    assert not (tmp_path / "o").exists()  # nothing written before the model is there


def test_a_revision_not_in_the_cache_offline(hub_cache, tmp_path, corpus, capsys):
    line = one_line_error(capsys, main(run_args(corpus, tmp_path / "o", "--model", HUB_ID, "--revision", "v9")))
    assert f"{HUB_ID} (revision v9)" in line and f"hf download {HUB_ID} --revision v9" in line


@pytest.mark.parametrize("model, fragment", [
    ("./nope", "model directory not found: nope"),
    ("nope/deeper/still", "model directory not found: nope/deeper/still"),
    ("bad--name", "model not found: bad--name is not a folder, nor a Hub id"),
])
def test_paths_and_bad_ids_are_one_line(model, fragment, hub_cache, tmp_path, corpus, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = one_line_error(capsys, main(run_args(corpus, tmp_path / "o", "--model", model)))
    assert fragment in line, line


def test_a_revision_needs_a_hub_id(hub_cache, minilm_path, tmp_path, corpus, capsys):
    line = one_line_error(capsys, main(run_args(corpus, tmp_path / "o", "--model", str(minilm_path),
                                                "--revision", "main")))
    assert "--revision main is for a Hub id" in line and str(minilm_path) in line
    line = one_line_error(capsys, main(run_args(corpus, tmp_path / "o", "--revision", "main")))
    assert "--revision main needs --model with a Hub id" in line


def test_a_folder_shadows_an_id_of_the_same_name(hub_cache, minilm_path, tmp_path, monkeypatch):
    """A path that exists is a folder, whatever it looks like (`org/name` in the working directory)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sentence-transformers").mkdir()
    (tmp_path / HUB_ID).symlink_to(minilm_path)
    source = resolve_model(HUB_ID)
    assert source.hub_id is None and source.path == Path(HUB_ID)


def test_the_python_api_and_load_model_take_a_hub_id(hub_cache, minilm_path):
    import bertscope

    loaded = load_model(HUB_ID, revision="v1")
    assert (loaded.source.hub_id, loaded.source.revision, loaded.source.commit) == (HUB_ID, "v1", TAG_COMMIT)
    assert loaded.record()["commit"] == TAG_COMMIT and loaded.n_layers == 6
    assert model_name(loaded.path) == "all-MiniLM-L6-v2" and loaded.origin == f"{HUB_ID} at {TAG_COMMIT}"
    scope = bertscope.load(HUB_ID)
    assert scope.loaded.source.commit == COMMIT
    assert load_model().record()["path"] == str(minilm_path)  # the default is still the embedded folder


def test_what_looks_like_a_path():
    for text in ("/abs", "./rel", "../rel", "~/x", "a/b/c", "dir/", ".hidden", "C:\\x"):
        assert looks_like_path(text), text
    for text in ("bert-base-uncased", "org/name", "FacebookAI/roberta-base", "a.b_c-d"):
        assert not looks_like_path(text), text
    with pytest.raises(UserError, match="is not a folder, nor a Hub id"):
        resolve_model("a..b")


def subprocess_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(p for p in sys.path if p), **extra)
    return env


def test_the_command_honours_the_environment_alone(tmp_path, minilm_path, corpus, folder_run):
    """The real process: HF_HUB_CACHE and HF_HUB_OFFLINE from the environment, nothing patched."""
    cache = tmp_path / "hf" / "hub"
    build_cache(cache, minilm_path)
    out = tmp_path / "process"
    env = subprocess_env(HF_HOME=str(tmp_path / "hf"), HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-m", "bertscope.cli", *run_args(corpus, out, "--model", HUB_ID)],
                          env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    assert (out / "heads.csv").read_bytes() == (folder_run / "heads.csv").read_bytes()
    assert json.loads((out / "run.json").read_text())["model"]["commit"] == COMMIT
    failed = subprocess.run([sys.executable, "-m", "bertscope.cli", *run_args(corpus, tmp_path / "x", "--model",
                                                                              "no-org/no-model")],
                            env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path, check=False)
    assert failed.returncode == 2 and failed.stderr.count("\n") == 1, failed.stderr
    assert failed.stderr.startswith("bertscope: error: ") and "no-org/no-model" in failed.stderr


def test_the_library_never_sets_hf_hub_offline(tmp_path):
    """Whether to reach the Hub is the user's environment's choice (the Makefile and CI set it)."""
    code = ("import os, bertscope.models.loading, bertscope.cli.main, bertscope.api, bertscope.models.source; "
            "print(os.environ.get('HF_HUB_OFFLINE'), os.environ.get('TRANSFORMERS_OFFLINE'))")
    done = subprocess.run([sys.executable, "-c", code], env=subprocess_env(), capture_output=True, text=True,
                          timeout=600, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None None"


# --- a download, from a stand-in for the Hub on 127.0.0.1 ------------------------------------


def fake_hub(repo_id: str, commit: str, files: dict[str, Path]):
    """Serve one repository the way the Hub's HTTP API does, as far as snapshot_download asks:
    repo_info (revision main or `commit`), the file tree, and each file; unknown repositories and
    revisions get the Hub's error codes. Returns (base URL, the paths asked for, stop)."""
    asked = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def send(self, code, body=b"", headers=None):
            self.send_response(code)
            for k, v in {"Content-Length": str(len(body)), **(headers or {})}.items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def send_json(self, data, code=200, headers=None):
            self.send(code, json.dumps(data).encode(), {"Content-Type": "application/json", **(headers or {})})

        def do_GET(self):
            path = unquote(urlparse(self.path).path)
            asked.append(path)
            api, resolve = f"/api/models/{repo_id}/", f"/{repo_id}/resolve/{commit}/"
            if path.startswith(api + "revision/"):
                if path.removeprefix(api + "revision/") not in ("main", commit):
                    return self.send_json({"error": "no revision"}, 404, {"X-Error-Code": "RevisionNotFound"})
                return self.send_json({"id": repo_id, "sha": commit, "siblings": [{"rfilename": f} for f in files]})
            if path.startswith(api + "tree/"):
                return self.send_json([{"type": "file", "path": name, "size": f.stat().st_size,
                                        "oid": hashlib.sha1(f.read_bytes()).hexdigest()} for name, f in files.items()])
            if path.startswith(resolve) and path.removeprefix(resolve) in files:
                data = files[path.removeprefix(resolve)].read_bytes()
                return self.send(200, data, {"X-Repo-Commit": commit, "ETag": f'"{hashlib.sha1(data).hexdigest()}"'})
            return self.send_json({"error": "not found"}, 404, {"X-Error-Code": "RepoNotFound"})

        do_HEAD = do_GET

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def stop():
        server.shutdown()
        server.server_close()
    return f"http://127.0.0.1:{server.server_address[1]}", asked, stop


def test_a_download_fills_the_cache_with_only_what_bertscope_reads(tmp_path, minilm_path, corpus, folder_run):
    """Online (the stand-in Hub): the id is downloaded into HF_HUB_CACHE, without the repository's
    other copies (onnx/, README); unknown ids and revisions are one line; then, offline, the
    cache alone serves the id. One process for all of it (huggingface_hub reads HF_ENDPOINT on import)."""
    files = {f.name: f for f in minilm_path.iterdir() if f.is_file()}
    files["onnx/model.onnx"] = minilm_path / "model.safetensors"  # what a real repository also holds
    files["pytorch_model.bin"] = minilm_path / "model.safetensors"  # never fetched: there are safetensors
    url, asked, stop = fake_hub(HUB_ID, COMMIT, files)
    cache, outs = tmp_path / "hf" / "hub", [tmp_path / f"out{i}" for i in range(4)]
    runs = [["--model", HUB_ID], ["--model", "no-org/no-model"], ["--model", HUB_ID, "--revision", "v7"]]
    code = ("import sys, json; from bertscope.cli.main import main; "
            f"print(json.dumps([main(a) for a in {[run_args(corpus, o, *r) for o, r in zip(outs, runs)]!r}]))")
    env = subprocess_env(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=url)
    try:
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600,
                              cwd=tmp_path, check=False)
    finally:
        stop()
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [0, 2, 2]
    assert (outs[0] / "heads.csv").read_bytes() == (folder_run / "heads.csv").read_bytes()
    assert json.loads((outs[0] / "run.json").read_text())["model"]["commit"] == COMMIT
    snapshot = cache / REPO / "snapshots" / COMMIT
    assert sorted(f.name for f in snapshot.iterdir()) == ["config.json", "model.safetensors", "special_tokens_map.json",
                                                          "tokenizer.json", "tokenizer_config.json", "vocab.txt"]
    assert not any("onnx" in a or a.endswith(".bin") for a in asked)
    errors = done.stderr.strip().splitlines()
    assert len(errors) == 2 and all(e.startswith("bertscope: error: ") for e in errors), done.stderr
    assert "no model no-org/no-model on the Hugging Face Hub" in errors[0]
    assert f"the Hub model {HUB_ID} has no revision v7" in errors[1]

    # offline now, the server gone: the cache it filled is enough
    offline = subprocess_env(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")
    again = subprocess.run([sys.executable, "-m", "bertscope.cli", *run_args(corpus, outs[3], "--model", HUB_ID)],
                           env=offline, capture_output=True, text=True, timeout=600, cwd=tmp_path, check=False)
    assert again.returncode == 0, again.stderr
    assert (outs[3] / "heads.csv").read_bytes() == (folder_run / "heads.csv").read_bytes()


def test_quiet_silences_the_hub_download_bars_for_the_download_only():
    """--quiet (the bertscope logger at WARNING) turns huggingface_hub's own bars off around the
    download and back on after; with INFO they stay as the user had them."""
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    from bertscope.models.source import download_bars

    before = are_progress_bars_disabled()
    enable_progress_bars()
    try:
        with download_bars(shown=False):
            assert are_progress_bars_disabled()
        assert not are_progress_bars_disabled()
        with download_bars(shown=True):
            assert not are_progress_bars_disabled()
        disable_progress_bars()  # the user's own choice is kept
        with download_bars(shown=False):
            assert are_progress_bars_disabled()
        assert are_progress_bars_disabled()
    finally:
        (disable_progress_bars if before else enable_progress_bars)()


# --- a Hub that accepts the connection and never answers ---------------------------------------


def test_a_hub_that_never_answers_is_one_line_after_a_bounded_wait(tmp_path, corpus):
    """A listening socket that never reads nor writes: the kernel accepts the connection, and
    huggingface_hub's repo_info (no timeout of its own) would wait for ever. The wait is bounded by
    HF_HUB_ETAG_TIMEOUT / HF_HUB_DOWNLOAD_TIMEOUT (1 s here) and the error says so in one line."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # connections complete in the kernel's backlog; nothing is ever read or written
    url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    env = subprocess_env(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=url, HF_HUB_ETAG_TIMEOUT="1",
                         HF_HUB_DOWNLOAD_TIMEOUT="1")
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "bertscope.cli", *run_args(corpus, tmp_path / "out", "--model",
                                                                                "some-org/some-model")],
                              env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    finally:
        silent.close()
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("bertscope: error: the Hugging Face Hub did not answer within 1 s")
    assert "some-org/some-model" in done.stderr and "HF_HUB_ETAG_TIMEOUT" in done.stderr
    assert time.monotonic() - start < 60  # the process's start-up and a 1 s wait, not for ever
    assert not (tmp_path / "out").exists()
