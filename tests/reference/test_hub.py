"""dstrain's Hugging Face Hub downloads against a local Hub, and huggingface_hub as the reference.

A Hub runs in this process (http.server on 127.0.0.1, threaded) and answers the endpoints as
huggingface_hub calls them: `/api/models/{id}/revision/{rev}` (commit and file list),
`/api/models/{id}/tree/{rev}` (for huggingface_hub's own snapshot_download), and HEAD/GET
`/{id}/resolve/{rev}/{file}` with X-Repo-Commit and ETag, LFS files (*.safetensors) as a 302 to a
second server standing for the CDN with X-Linked-Etag (their sha256) and X-Linked-Size. It serves a
tiny random Qwen2 model saved with transformers and a byte-level BPE tokenizer built with
`tokenizers`, under the seed config's hub id. Faults are injected per request: 5xx/429 answers
before success, 401 for a gated repo without its token, 404s, 416 or an ignored Range, a connection
cut mid-file, and a transfer held half way while the test kills dstrain.

Interoperability is checked with huggingface_hub itself: after dstrain downloads, hf_hub_download(
..., local_files_only=True) and scan_cache_dir() find the files; a snapshot huggingface_hub
downloaded from the same server is used by dstrain without a request."""

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote, unquote, urlsplit

import pytest
import torch

import reflib

transformers = pytest.importorskip("transformers")
huggingface_hub = pytest.importorskip("huggingface_hub")
tokenizers = pytest.importorskip("tokenizers")

SEED_ID = "Qwen/Qwen2.5-0.5B"  # the hub id of the seed train.yaml
TOKEN = "hf_local_test_token"
EOS = "<|endoftext|>"
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json"]
EXTRA_FILES = {"README.md": b"# tiny\n", ".gitattributes": b"*.safetensors filter=lfs\n",
               "pytorch_model.bin": b"not fetched" * 100, "original/params.json": b"{}"}
CORPUS = os.path.join(reflib.REPO, "configs", "data", "tiny_corpus.txt")


# ----------------------------------------------------------------------------------------------
# The local Hub


def git_blob_sha1(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def is_lfs(name):
    return name.endswith((".safetensors", ".bin"))


class LocalHub:
    """Repos, their commits and the request log; faults are armed by the tests, each used once."""

    def __init__(self):
        # repo id → {"refs": {branch or tag: commit}, "commits": {commit: {file: bytes}}}
        self.repos = {}
        self.gated = {}    # repo id → the token that opens it
        self.aliases = {}  # renamed repo id → its new id (a same-origin 307)
        self.blobs = {}    # sha256 → bytes, what the CDN serves
        self.log = []
        self.lock = threading.Lock()
        self.faults = {}        # (kind, name) → statuses answered before the real answer
        self.range_faults = {}  # file name → "416" | "ignore" for its next Range request
        self.cuts = {}          # file name → bytes sent before the connection is dropped
        self.holds = {}         # file name → (bytes, reached Event, release Event)
        self.commits = {}       # repo id → its commit hashes, oldest first
        self.hub = self._serve("hub")
        self.cdn = self._serve("cdn")
        self.url = f"http://127.0.0.1:{self.hub.server_address[1]}"
        self.cdn_url = f"http://127.0.0.1:{self.cdn.server_address[1]}"

    def _serve(self, role):
        server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(self, role))
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    def close(self):
        for s in (self.hub, self.cdn):
            s.shutdown()
            s.server_close()

    def add_repo(self, repo_id, commits):
        """commits: [(ref names, {file: bytes})], oldest first. Returns the commit hashes."""
        repo = self.repos.setdefault(repo_id, {"refs": {}, "commits": {}})
        hashes = []
        for refs, files in commits:
            digest = hashlib.sha1(repo_id.encode())
            for name in sorted(files):
                digest.update(name.encode() + hashlib.sha256(files[name]).digest())
            commit = digest.hexdigest()
            repo["commits"][commit] = dict(files)
            for ref in refs:
                repo["refs"][ref] = commit
            hashes.append(commit)
        return hashes

    def resolve_revision(self, repo, rev):
        if rev in repo["commits"]:
            return rev
        return repo["refs"].get(rev)

    def reset(self):
        with self.lock:
            self.log.clear()
            self.faults.clear()
            self.range_faults.clear()
            self.cuts.clear()
            self.holds.clear()

    def take_fault(self, key):
        with self.lock:
            queue = self.faults.get(key)
            return queue.pop(0) if queue else None

    def requests(self, server=None, method=None, name=None):
        with self.lock:
            return [e for e in self.log if (server is None or e["server"] == server)
                    and (method is None or e["method"] == method)
                    and (name is None or e["path"].endswith("/" + name))]


def make_handler(hub, role):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_HEAD(self):
            self.route("HEAD")

        def do_GET(self):
            self.route("GET")

        def reply(self, status, headers=None, body=b"", send_body=True):
            with hub.lock:
                hub.log.append({"server": role, "method": self.command,
                                "path": urlsplit(self.path).path, "status": status,
                                "range": self.headers.get("Range"),
                                "auth": self.headers.get("Authorization")})
            self.send_response(status)
            headers = dict(headers or {})
            headers.setdefault("Content-Length", str(len(body)))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            if send_body and self.command != "HEAD":
                self.wfile.write(body)

        def error(self, status, code=None, message=None, extra=None):
            headers = dict(extra or {})
            if code:
                headers["X-Error-Code"] = code
            if message:
                headers["X-Error-Message"] = message
            self.reply(status, headers, (message or "").encode())

        def injected(self, kind, name):
            status = hub.take_fault((kind, name))
            if status is None:
                return False
            self.reply(status, {"Retry-After": "1"} if status == 429 else {}, b"try again")
            return True

        def route(self, method):
            path = urlsplit(self.path).path
            parts = path.split("/")
            if role == "cdn":
                return self.cdn_file(parts)
            if path.startswith("/api/models/") and len(parts) >= 7 and parts[5] in ("revision",
                                                                                    "tree"):
                return self.api(f"{parts[3]}/{parts[4]}", parts[5], unquote(parts[6]))
            if len(parts) >= 6 and parts[3] == "resolve":
                return self.resolve(f"{parts[1]}/{parts[2]}", parts[4], "/".join(parts[5:]))
            self.error(404, message="no such endpoint")

        def find(self, repo_id, rev):
            """(repo, commit), or None after answering the error."""
            repo = hub.repos.get(repo_id)
            if repo is None:
                self.error(404, "RepoNotFound", "Repository not found")
                return None
            commit = hub.resolve_revision(repo, rev)
            if commit is None:
                self.error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
                return None
            return repo, commit

        def api(self, repo_id, what, rev):
            if self.injected("api", repo_id):
                return
            if repo_id in hub.aliases:
                new = hub.aliases[repo_id]
                return self.reply(307, {"Location": f"/api/models/{new}/{what}/{quote(rev, safe='')}"})
            found = self.find(repo_id, rev)
            if found is None:
                return
            repo, commit = found
            files = repo["commits"][commit]
            if what == "revision":
                info = {"_id": commit[:24], "id": repo_id, "modelId": repo_id, "sha": commit,
                        "private": False, "gated": "auto" if repo_id in hub.gated else False,
                        "disabled": False, "tags": [], "downloads": 0, "likes": 0,
                        "library_name": "transformers",
                        "siblings": [{"rfilename": f} for f in sorted(files)]}
            else:
                info = []
                for name in sorted(files):
                    data = files[name]
                    entry = {"type": "file", "path": name, "size": len(data),
                             "oid": git_blob_sha1(data)}
                    if is_lfs(name):
                        entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                                        "pointerSize": 134}
                    info.append(entry)
            self.reply(200, {"Content-Type": "application/json"}, json.dumps(info).encode())

        def resolve(self, repo_id, quoted_rev, quoted_file):
            name = unquote(quoted_file)
            if self.injected(self.command.lower(), name):
                return
            if repo_id in hub.aliases:
                new = hub.aliases[repo_id]
                return self.reply(307, {"Location": f"/{new}/resolve/{quoted_rev}/{quoted_file}"})
            token = hub.gated.get(repo_id)
            if token is not None and self.headers.get("Authorization") != f"Bearer {token}":
                return self.error(401, "GatedRepo",
                                  f"Access to model {repo_id} is restricted. You must have access "
                                  "to it and be authenticated to access it. Please log in.")
            found = self.find(repo_id, unquote(quoted_rev))
            if found is None:
                return
            repo, commit = found
            files = repo["commits"][commit]
            if name not in files:
                return self.error(404, "EntryNotFound", f"{name} does not exist",
                                  {"X-Repo-Commit": commit})
            data = files[name]
            if is_lfs(name):
                sha = hashlib.sha256(data).hexdigest()
                hub.blobs[sha] = data
                return self.reply(302, {
                    "X-Repo-Commit": commit, "X-Linked-Etag": f'"{sha}"',
                    "X-Linked-Size": str(len(data)), "ETag": f'"{git_blob_sha1(b"pointer" + data)}"',
                    "Location": f"{hub.cdn_url}/cdn/{sha}/{quote(name)}?X-Amz-Signature=local"})
            etag = git_blob_sha1(data)
            # A weak ETag on one file: huggingface_hub and dstrain strip W/ and the quotes alike.
            etag = f'W/"{etag}"' if name == "tokenizer_config.json" else f'"{etag}"'
            self.send_file(data, name, {"X-Repo-Commit": commit, "ETag": etag})

        def cdn_file(self, parts):
            if len(parts) < 4 or parts[1] != "cdn" or parts[2] not in hub.blobs:
                return self.error(404, message="no such blob")
            if self.auth_leaked():
                return
            name = unquote("/".join(parts[3:]))
            if self.injected("cdn", name):
                return
            self.send_file(hub.blobs[parts[2]], name, {"ETag": f'"{parts[2]}"'})

        def auth_leaked(self):
            """The token must never reach the CDN."""
            if self.headers.get("Authorization"):
                self.error(400, message="Authorization sent to the CDN")
                return True
            return False

        def send_file(self, data, name, headers):
            """200, or 206 for `Range: bytes=N-`, with the armed range fault, cut or hold."""
            headers = dict(headers, **{"Accept-Ranges": "bytes"})
            rng = self.headers.get("Range")
            fault = hub.range_faults.pop(name, None) if rng else None
            start, status = 0, 200
            if rng and fault != "ignore":
                m = re.fullmatch(r"bytes=(\d+)-", rng)
                start = int(m.group(1)) if m else 0
                if fault == "416" or start >= len(data):
                    return self.reply(416, {"Content-Range": f"bytes */{len(data)}"})
                status = 206
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            body = data[start:]
            if self.command == "HEAD":
                return self.reply(status, dict(headers, **{"Content-Length": str(len(body))}))
            cut = hub.cuts.pop(name, None)
            hold = hub.holds.pop(name, None)
            if cut is None and hold is None:
                return self.reply(status, headers, body)
            sent = cut if cut is not None else hold[0]
            self.reply(status, dict(headers, **{"Content-Length": str(len(body))}), send_body=False)
            self.wfile.write(body[:sent])
            self.wfile.flush()
            if hold is not None:
                hold[1].set()
                hold[2].wait(30)
            self.close_connection = True  # the client gets fewer bytes than announced

    return Handler


# ----------------------------------------------------------------------------------------------
# The repos it serves


def build_tokenizer(out_dir):
    """A byte-level BPE like Qwen2's, trained on the tiny corpus, saved by transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    with open(CORPUS, encoding="utf-8") as f:
        tok.train_from_iterator(f.read().splitlines()[:2000], trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)
    fast.save_pretrained(out_dir)
    return len(fast), fast.convert_tokens_to_ids(EOS)


def read_dir(d):
    files = {}
    for root, _, names in os.walk(d):
        for n in names:
            path = os.path.join(root, n)
            files[os.path.relpath(path, d)] = open(path, "rb").read()
    return files


@pytest.fixture(scope="module")
def repo_files(tmp_path_factory):
    """{"sharded": files, "single": files}: one tiny Qwen2 model with tokenizer and generation
    config, its weights once as shards with an index and once as model.safetensors."""
    base = tmp_path_factory.mktemp("repos")
    vocab, eos = build_tokenizer(str(base / "tok"))
    cfg = dict(reflib.TINY_CONFIGS["qwen2-untied"], vocab_size=vocab + 8, bos_token_id=eos,
               eos_token_id=eos, pad_token_id=eos)
    single = reflib.save_tiny_model(str(base / "single"), cfg)
    model = transformers.AutoModelForCausalLM.from_pretrained(single, dtype=torch.float32)
    model.save_pretrained(str(base / "sharded"), max_shard_size="60KB")
    out = {}
    for kind in ("single", "sharded"):
        files = read_dir(str(base / kind))
        files.update(read_dir(str(base / "tok")))
        files.update(EXTRA_FILES)
        out[kind] = files
    assert "model.safetensors.index.json" in out["sharded"]
    assert sum(n.endswith(".safetensors") for n in out["sharded"]) >= 3
    return out


@pytest.fixture(scope="module")
def hub(repo_files):
    h = LocalHub()
    h.commits[SEED_ID] = h.add_repo(SEED_ID, [(["v1"], repo_files["single"]),
                                              (["main"], repo_files["sharded"])])
    h.commits["org/tiny"] = h.add_repo("org/tiny", [(["main"], repo_files["single"])])
    h.commits["org/gated"] = h.add_repo("org/gated", [(["main"], repo_files["single"])])
    h.gated["org/gated"] = TOKEN
    h.aliases["org/renamed"] = "org/tiny"
    yield h
    h.close()


@pytest.fixture
def server(hub):
    hub.reset()
    yield hub
    hub.reset()


def model_files(files):
    """What dstrain fetches of a repo: config, generation config, tokenizer, safetensors."""
    keep = {"config.json", "generation_config.json", *TOKENIZER_FILES}
    return sorted(n for n in files if n in keep or (n.endswith(".safetensors") and "/" not in n)
                  or n == "model.safetensors.index.json")


# ----------------------------------------------------------------------------------------------
# Running dstrain


def clean_env(hub, cache=None, **extra):
    """The environment without the caller's HF_* settings and proxies, pointed at the local Hub."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HF_", "HUGGING", "TRANSFORMERS_"))
           and k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
    env.update(HF_ENDPOINT=hub.url, no_proxy="127.0.0.1,localhost", NO_PROXY="127.0.0.1,localhost",
               DSTRAIN_DEVICE=reflib.device())
    if cache is not None:
        env["HF_HUB_CACHE"] = str(cache)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def dstrain(args, env, check=True, timeout=120, cwd=None):
    r = subprocess.run([reflib.dstrain_binary(), *map(str, args)], env=env, timeout=timeout, cwd=cwd,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    if check:
        assert r.returncode == 0, f"dstrain {args} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return r


def download(hub, cache, repo, *args, **env):
    r = dstrain(["download", repo, *args], clean_env(hub, cache, **env))
    return r.stdout.strip().splitlines()[-1], r


def repo_dir(cache, repo_id):
    return os.path.join(str(cache), "models--" + repo_id.replace("/", "--"))


def check_snapshot(cache, repo_id, commit, files):
    """The cache layout is huggingface_hub's: relative symlinks to blobs named by ETag (sha256
    for LFS files), holding exactly the model files, and no partial download left."""
    snap = os.path.join(repo_dir(cache, repo_id), "snapshots", commit)
    got = sorted(os.path.relpath(os.path.join(r, n), snap) for r, _, ns in os.walk(snap) for n in ns)
    assert got == model_files(files)
    for name in got:
        link = os.path.join(snap, name)
        target = os.readlink(link)
        assert os.path.islink(link) and not os.path.isabs(target)
        assert target.startswith("../../blobs/"), target
        data = files[name]
        assert open(link, "rb").read() == data
        want = hashlib.sha256(data).hexdigest() if is_lfs(name) else git_blob_sha1(data)
        assert os.path.basename(target) == want, name
    blobs = os.listdir(os.path.join(repo_dir(cache, repo_id), "blobs"))
    assert not [b for b in blobs if b.endswith(".incomplete")]
    return snap


def fetched(hub):
    """{file: number of GETs that delivered it}: from the Hub for small files, the CDN for LFS."""
    counts = {}
    for e in hub.log:
        if e["method"] == "GET" and e["status"] in (200, 206) and "/api/" not in e["path"]:
            name = unquote(e["path"].split("/resolve/", 1)[-1].split("/", 1)[-1]
                           if e["server"] == "hub" else e["path"].split("/", 3)[3])
            counts[name] = counts.get(name, 0) + 1
    return counts


# ----------------------------------------------------------------------------------------------
# Tests


def test_download_is_huggingface_hubs_cache_and_it_reads_it(server, repo_files, tmp_path):
    cache = tmp_path / "hub"
    path, r = download(server, cache, SEED_ID)
    commit = server.commits[SEED_ID][1]
    files = repo_files["sharded"]
    snap = check_snapshot(cache, SEED_ID, commit, files)
    assert path == snap
    assert open(os.path.join(repo_dir(cache, SEED_ID), "refs", "main")).read() == commit
    # Nothing but the model files was fetched, each once; the metadata came from the commit the
    # revision resolved to; the token-free run sent no Authorization anywhere.
    assert fetched(server) == {n: 1 for n in model_files(files)}
    assert len(server.requests(method="GET", name="main")) == 1  # /api/models/.../revision/main
    assert all(f"/resolve/{commit}/" in e["path"] for e in server.requests("hub", "HEAD"))
    assert not [e for e in server.log if e["auth"]]
    assert "downloaded model-00001-of-" in r.stdout and "downloaded config.json" in r.stdout

    # huggingface_hub finds every file offline, and its cache scan sees one clean revision.
    for name in model_files(files):
        got = huggingface_hub.hf_hub_download(SEED_ID, name, cache_dir=str(cache),
                                              local_files_only=True)
        assert got == os.path.join(snap, name)
    info = huggingface_hub.scan_cache_dir(str(cache))
    assert not info.warnings and not info.incomplete_files
    (repo,) = info.repos
    assert repo.repo_id == SEED_ID and repo.repo_type == "model"
    (rev,) = repo.revisions
    assert rev.commit_hash == commit and rev.refs == frozenset({"main"})
    assert sorted(f.file_name for f in rev.files) == sorted(
        os.path.basename(n) for n in model_files(files))
    assert repo.size_on_disk == sum(len(files[n]) for n in model_files(files))

    # A second run finds the model in the cache and makes no request.
    server.reset()
    assert download(server, cache, SEED_ID)[0] == snap
    assert server.log == []


def test_snapshot_huggingface_hub_downloaded_is_used_without_a_request(server, repo_files, tmp_path):
    cache = tmp_path / "hub"
    snap = huggingface_hub.snapshot_download(SEED_ID, cache_dir=str(cache), endpoint=server.url,
                                             token=False)
    assert server.log, "huggingface_hub did not use the local Hub"
    server.reset()
    path, _ = download(server, cache, SEED_ID)
    assert path == snap and server.log == []


def test_partial_snapshot_from_huggingface_hub_is_completed(server, repo_files, tmp_path):
    cache = tmp_path / "hub"
    huggingface_hub.hf_hub_download("org/tiny", "config.json", cache_dir=str(cache),
                                    endpoint=server.url, token=False)
    server.reset()
    download(server, cache, "org/tiny")
    files = repo_files["single"]
    check_snapshot(cache, "org/tiny", server.commits["org/tiny"][0], files)
    assert fetched(server) == {n: 1 for n in model_files(files) if n != "config.json"}


def test_revision_tag_commit_and_config_key(server, repo_files, tmp_path):
    cache = tmp_path / "hub"
    v1, main = server.commits[SEED_ID]
    path, _ = download(server, cache, SEED_ID, "--revision", "v1")
    check_snapshot(cache, SEED_ID, v1, repo_files["single"])
    assert open(os.path.join(repo_dir(cache, SEED_ID), "refs", "v1")).read() == v1
    path, _ = download(server, cache, SEED_ID, "--revision", main)
    check_snapshot(cache, SEED_ID, main, repo_files["sharded"])
    assert sorted(os.listdir(os.path.join(repo_dir(cache, SEED_ID), "refs"))) == ["v1"]
    # model.revision in a config: `dstrain estimate` reads config.json only, so no weights move.
    cache2 = tmp_path / "hub2"
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"model:\n  name_or_path: {SEED_ID}\n  revision: v1\ndata:\n  train_path: x\n")
    server.reset()
    r = dstrain(["estimate", cfg, "--json"], clean_env(server, cache2))
    assert os.path.join("snapshots", v1) in r.stdout
    assert not [n for n in fetched(server) if n.endswith(".safetensors")]
    bad = dstrain(["download", SEED_ID, "--revision", "nope"], clean_env(server, cache2), check=False)
    assert bad.returncode == 2 and "has no revision 'nope'" in bad.stderr


def test_retries_on_5xx_and_429_and_same_origin_redirects(server, repo_files, tmp_path):
    cache = tmp_path / "hub"
    server.faults[("api", "org/tiny")] = [503]
    server.faults[("head", "config.json")] = [429]
    server.faults[("get", "tokenizer.json")] = [500]
    server.faults[("cdn", "model.safetensors")] = [502, 503]
    start = time.time()
    _, r = download(server, cache, "org/renamed")  # 307 to org/tiny on the same origin
    files = repo_files["single"]
    check_snapshot(cache, "org/renamed", server.commits["org/tiny"][0], files)
    assert time.time() - start < 30
    statuses = [e["status"] for e in server.log]
    for code in (503, 429, 500, 502, 307):
        assert code in statuses
    assert r.stderr.count("trying again") + r.stderr.count("retrying") == 5, r.stderr
    assert fetched(server) == {n: 1 for n in model_files(files)}


def test_gated_repo_needs_a_token(server, repo_files, tmp_path):
    cache = tmp_path / "hub"
    r = dstrain(["download", "org/gated"], clean_env(server, cache), check=False)
    assert r.returncode == 2, r.stderr
    assert "gated" in r.stderr and "set HF_TOKEN" in r.stderr
    r = dstrain(["download", "org/gated"], clean_env(server, cache, HF_TOKEN="hf_wrong"), check=False)
    assert r.returncode == 2 and "the token from HF_TOKEN was sent" in r.stderr
    server.reset()
    download(server, cache, "org/gated", HF_TOKEN=TOKEN)
    check_snapshot(cache, "org/gated", server.commits["org/gated"][0], repo_files["single"])
    assert all(e["auth"] == f"Bearer {TOKEN}" for e in server.requests("hub"))
    assert server.requests("cdn") and not [e for e in server.requests("cdn") if e["auth"]]
    # The token file under HF_HOME, and the cache under HF_HOME/hub.
    home = tmp_path / "home"
    home.mkdir()
    (home / "token").write_text(TOKEN + "\n")
    env = clean_env(server, HF_HOME=home)
    dstrain(["download", "org/gated"], env)
    assert os.path.isdir(repo_dir(home / "hub", "org/gated"))


def test_missing_repo_and_offline_mode(server, repo_files, tmp_path):
    cache = tmp_path / "hub"
    r = dstrain(["download", "org/nothing"], clean_env(server, cache), check=False)
    assert r.returncode == 2 and "'org/nothing' was not found" in r.stderr, r.stderr
    server.reset()
    r = dstrain(["download", "org/tiny"], clean_env(server, cache, HF_HUB_OFFLINE=1), check=False)
    assert r.returncode == 2 and "HF_HUB_OFFLINE" in r.stderr and server.log == []
    download(server, cache, "org/tiny")
    server.reset()
    download(server, cache, "org/tiny", HF_HUB_OFFLINE=1)
    assert server.log == []


def incomplete_of(cache, repo_id, data):
    return os.path.join(repo_dir(cache, repo_id), "blobs",
                        hashlib.sha256(data).hexdigest() + ".incomplete")


def test_killed_download_resumes_with_range_and_is_verified(server, repo_files, tmp_path):
    cache = tmp_path / "hub"
    data = repo_files["single"]["model.safetensors"]
    half = len(data) // 2
    reached, release = threading.Event(), threading.Event()
    server.holds["model.safetensors"] = (half, reached, release)
    proc = subprocess.Popen([reflib.dstrain_binary(), "download", "org/tiny"],
                            env=clean_env(server, cache), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        assert reached.wait(60), "dstrain never reached the weights"
        partial = incomplete_of(cache, "org/tiny", data)
        deadline = time.time() + 10
        while time.time() < deadline and (not os.path.exists(partial)
                                          or os.path.getsize(partial) < half):
            time.sleep(0.05)
        assert os.path.getsize(partial) == half
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        release.set()
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)
    assert not os.path.exists(os.path.join(repo_dir(cache, "org/tiny"), "refs", "main"))
    server.reset()
    download(server, cache, "org/tiny")
    check_snapshot(cache, "org/tiny", server.commits["org/tiny"][0], repo_files["single"])
    (get,) = server.requests("cdn", "GET")
    assert get["range"] == f"bytes={half}-" and get["status"] == 206
    assert not huggingface_hub.scan_cache_dir(str(cache)).incomplete_files


def test_processes_sharing_a_cache_download_once(server, repo_files, tmp_path):
    """Two nodes on one NFS cache, or two jobs on one host: the second waits on the cache's lock
    while the first downloads, then finds the snapshot complete."""
    cache = tmp_path / "hub"
    reached, release = threading.Event(), threading.Event()
    server.holds["model.safetensors"] = (1000, reached, release)
    env = clean_env(server, cache)
    cmd = [reflib.dstrain_binary(), "download", "org/tiny"]
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    second = None
    try:
        assert reached.wait(60), "the first download never reached the weights"
        second = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        time.sleep(1.0)
        assert second.poll() is None  # waiting on the lock, having asked the Hub nothing
        assert len([e for e in server.log if "/api/models/" in e["path"]]) == 1
    finally:
        release.set()
        outs = [p.communicate(timeout=60)[0].decode() for p in (first, second) if p is not None]
    assert first.returncode == 0 and second.returncode == 0, outs
    assert outs[0].splitlines()[-1] == outs[1].splitlines()[-1]
    check_snapshot(cache, "org/tiny", server.commits["org/tiny"][0], repo_files["single"])
    assert len([e for e in server.log if "/api/models/" in e["path"]]) == 1
    # The held transfer was cut after 1000 bytes and resumed by the first process.
    assert [e["range"] for e in server.requests("cdn", "GET")] == [None, "bytes=1000-"]


def test_connection_cut_mid_file_resumes_in_the_same_run(server, repo_files, tmp_path):
    cache = tmp_path / "hub"
    data = repo_files["single"]["model.safetensors"]
    server.cuts["model.safetensors"] = len(data) // 3
    download(server, cache, "org/tiny")
    check_snapshot(cache, "org/tiny", server.commits["org/tiny"][0], repo_files["single"])
    first, second = server.requests("cdn", "GET")
    assert first["range"] is None and second["range"] == f"bytes={len(data) // 3}-"


def test_416_ignored_range_and_corrupt_partial_start_over(server, repo_files, tmp_path):
    data = repo_files["single"]["model.safetensors"]
    commit = server.commits["org/tiny"][0]
    for case in ("416", "ignore", "corrupt"):
        cache = tmp_path / case
        partial = incomplete_of(cache, "org/tiny", data)
        os.makedirs(os.path.dirname(partial))
        with open(partial, "wb") as f:  # a prefix, or (corrupt) the full size with bytes flipped
            f.write(data[: len(data) // 2] if case != "corrupt" else bytes(b ^ 1 for b in data))
        server.reset()
        if case != "corrupt":
            server.range_faults["model.safetensors"] = case
        _, r = download(server, cache, "org/tiny")
        check_snapshot(cache, "org/tiny", commit, repo_files["single"])
        gets = [(e["range"], e["status"]) for e in server.requests("cdn", "GET")]
        if case == "416":
            assert gets == [(f"bytes={len(data) // 2}-", 416), (None, 200)], gets
        elif case == "ignore":
            assert gets == [(f"bytes={len(data) // 2}-", 200)], gets
        else:
            assert gets == [(None, 200)] and "sha256" in r.stderr, (gets, r.stderr)


def test_seed_train_yaml_runs_with_hub_id_and_parquet_data(server, repo_files, tmp_path):
    seed = os.path.join(reflib.SHARED, "seed-configs", "train.yaml")
    if not os.path.exists(seed):
        pytest.skip(f"{seed} is absent")
    shutil.copy(seed, tmp_path / "train.yaml")
    assert f'name_or_path: "{SEED_ID}"' in open(seed).read()
    # The data where the seed config says it is: Parquet files with a "text" column.
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow
    lines = [ln for ln in open(CORPUS, encoding="utf-8").read().split("\n") if ln]
    data_dir = tmp_path / "data" / "03_primary"
    data_dir.mkdir(parents=True)
    pq.write_table(pyarrow.table({"text": lines[:-50]}), data_dir / "train.parquet")
    pq.write_table(pyarrow.table({"text": lines[-50:]}), data_dir / "valid.parquet")
    cache = tmp_path / "hub"
    run = tmp_path / "run"
    sets = ["data.max_length=64", "training.max_steps=3", "logging.out_dir=" + str(run),
            "logging.metrics_path=" + str(run / "metrics.jsonl"), "logging.progress=false",
            "checkpoint.dir=" + str(run / "checkpoints")]
    args = ["launch", "--nproc", "2", tmp_path / "train.yaml"]
    for s in sets:
        args += ["--set", s]
    r = dstrain(args, clean_env(server, cache, OMP_NUM_THREADS=1), timeout=300, cwd=tmp_path)
    summary = json.load(open(run / "summary.json"))
    assert summary["status"] == "completed" and summary["steps"] == 3, r.stdout
    # Two ranks, one download: each file fetched once, the revision asked once.
    files = repo_files["sharded"]
    check_snapshot(cache, SEED_ID, server.commits[SEED_ID][1], files)
    assert fetched(server) == {n: 1 for n in model_files(files)}
    assert len([e for e in server.log if "/api/models/" in e["path"]]) == 1
