"""A real Azure Blob Storage server on loopback for the object-storage tests: Azurite, Microsoft's
Azure Storage emulator (the npm package ``azurite``, pinned in tests/azurite/package.json), its blob
service started on a free port with nothing on disk; the tests talk to it over HTTP with the real
libraries (obstore, azure-storage-blob), never through mocked calls.

The fixture installs Azurite itself when tests/azurite/node_modules lacks it (``npm ci``, once,
under a file lock, so sessions started side by side do not race), and skips only when ``node`` or
``npm`` is not on PATH.

``azure_server`` (session): the endpoint, an admin client (azure-storage-blob) and
:meth:`AzureServer.env`, the environment a subprocess (the CLI) needs to reach it;
``azure_env``: this process's environment pointed at it; ``azure_container``: a fresh, empty
container per test (its name).
"""
from __future__ import annotations

import fcntl
import itertools
import logging
import os
import pathlib
import queue
import re
import shutil
import subprocess
import threading
from dataclasses import dataclass, field

import pytest

ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
"""The emulator's well-known account and key (public, the same in every Azurite). With
``AZURE_STORAGE_USE_EMULATOR=true`` obstore uses them unless told otherwise."""
HERE = pathlib.Path(__file__).resolve().parents[1] / "azurite"  # tests/azurite
BLOB = HERE / "node_modules" / ".bin" / "azurite-blob"
INSTALL_TIMEOUT = 600.0
"""How long ``npm ci`` may take (a guard against hanging forever; it takes seconds)."""
START_TIMEOUT = 60.0
#: Environment settings through which another Azure account or credential could be picked up.
FOREIGN_SETTINGS = ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_ACCESS_KEY",
                    "AZURE_STORAGE_SAS_KEY", "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_TOKEN", "AZURE_STORAGE_ENDPOINT",
                    "AZURE_STORAGE_CONNECTION_STRING", "AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET",
                    "AZURE_FEDERATED_TOKEN_FILE")
_names = itertools.count()


def install_azurite() -> pathlib.Path:
    """``azurite-blob``, installed into tests/azurite/node_modules first if it is not there."""
    if BLOB.exists():
        return BLOB
    npm, node = shutil.which("npm"), shutil.which("node")
    if npm is None or node is None:
        pytest.skip("the Azure tests run Azurite, the Azure Storage emulator: they need node and npm on PATH")
    with open(HERE / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be installing it: wait for it
        if not BLOB.exists():
            command = "ci" if (HERE / "package-lock.json").exists() else "install"
            done = subprocess.run([npm, command, "--no-audit", "--no-fund", "--loglevel=error"], cwd=HERE,
                                  capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
            if done.returncode != 0 or not BLOB.exists():
                raise RuntimeError(f"npm {command} in {HERE} failed (exit {done.returncode}): "
                                   f"{(done.stdout + done.stderr)[-3000:]}")
    return BLOB


@dataclass
class AzureServer:
    endpoint: str
    """``http://127.0.0.1:PORT`` (the account is the URL's first path segment)."""
    admin: object = field(repr=False)
    """An azure-storage-blob ``BlobServiceClient`` on the account (containers, blobs, blocks)."""

    @property
    def env(self) -> dict[str, str]:
        """What a process needs to reach this server through obstore: the emulator's account and
        key are its defaults under ``AZURE_STORAGE_USE_EMULATOR``."""
        return {"AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": self.endpoint,
                "MODELINIT_STORE_RETRIES": "1"}

    def new_container(self) -> str:
        """A new empty container (3-63 characters: lower-case letters, digits, hyphens)."""
        name = f"modelinit-test-{os.getpid()}-{next(_names)}"
        self.admin.create_container(name)
        return name

    def container(self, name: str):
        return self.admin.get_container_client(name)

    def blobs(self, container: str, prefix: str = "") -> dict[str, bytes]:
        """Every committed blob whose name starts with ``prefix`` (names relative to it) with its bytes."""
        client = self.container(container)
        return {b.name[len(prefix):].lstrip("/"): client.download_blob(b.name).readall()
                for b in client.list_blobs(name_starts_with=prefix)}

    def uncommitted(self, container: str, prefix: str = "") -> list[str]:
        """Blobs under ``prefix`` holding uncommitted blocks (full names): an upload begun and
        never committed, Azure's open multipart upload. The service drops them after 7 days, or
        when a block list is committed for the blob."""
        client = self.container(container)
        out = []
        for b in client.list_blobs(name_starts_with=prefix, include=["uncommittedblobs"]):
            _, uncommitted = client.get_blob_client(b.name).get_block_list("uncommitted")
            if uncommitted:
                out.append(b.name)
        return out


def _lines(stream, into: queue.Queue) -> None:
    """Every line of ``stream`` into ``into`` (read to the end, so the child never blocks on a full pipe)."""
    for line in stream:
        into.put(line)
    into.put(None)


@pytest.fixture(scope="session")
def azure_server(tmp_path_factory):
    pytest.importorskip("obstore")
    blob = pytest.importorskip("azure.storage.blob")
    program = install_azurite()
    logging.getLogger("azure").setLevel(logging.WARNING)  # the SDK logs every request's headers at INFO
    proc = subprocess.Popen(
        [str(program), "--blobHost", "127.0.0.1", "--blobPort", "0", "--inMemoryPersistence", "--silent",
         "--skipApiVersionCheck", "--loose", "--disableTelemetry"],
        cwd=tmp_path_factory.mktemp("azurite"), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_lines, args=(proc.stdout, lines), daemon=True).start()
    seen: list[str] = []
    try:
        while True:
            try:
                line = lines.get(timeout=START_TIMEOUT)
            except queue.Empty:
                raise RuntimeError(f"Azurite did not listen within {START_TIMEOUT:.0f} s: {''.join(seen)}") from None
            if line is None:
                raise RuntimeError(f"Azurite exited ({proc.wait()}) before listening: {''.join(seen)}")
            seen.append(line)
            m = re.search(r"successfully listens on (http://127\.0\.0\.1:\d+)", line)
            if m:
                endpoint = m.group(1)
                break
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    admin = blob.BlobServiceClient(f"{endpoint}/{ACCOUNT}", credential={"account_name": ACCOUNT, "account_key": KEY})
    try:
        yield AzureServer(endpoint, admin)
    finally:
        admin.close()
        proc.terminate()
        try:
            proc.wait(timeout=START_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture()
def azure_env(azure_server, monkeypatch):
    """This process's environment pointed at the server (obstore reads it); no other Azure account."""
    for k in FOREIGN_SETTINGS:
        monkeypatch.delenv(k, raising=False)
    for k, v in azure_server.env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr("modelinit.bucket.RETRIES", 1)
    return azure_server


@pytest.fixture()
def azure_container(azure_env) -> str:
    """A new empty container (its name); the environment points at the server."""
    return azure_env.new_container()
