"""One interface for every object store the tests run against, so that one test runs on all of
them: S3 (moto's server, tests/support/s3_server.py) and Azure Blob Storage (Azurite,
tests/support/azure_server.py), both real servers on loopback reached through the real libraries.

``store`` (a fixture, parametrized ``s3`` / ``azure``): this process's environment pointed at that
store's server, and a :class:`Store` to set up and inspect it: fresh prefixes, the objects under a
prefix, uploads begun and never finished, a container that does not exist, wrong credentials, an
unreachable endpoint, and a loopback proxy in front of the server that refuses chosen requests.
``s3_store`` and ``azure_store`` are each one alone, and :func:`open_store` any one by name, for a
test that picks its stores itself.

A prefix is named by its URL (``s3://BUCKET/m``, ``az://CONTAINER/m``); object names are relative
to it, as modelinit's own listing names them.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
from dataclasses import dataclass, field
from typing import Callable, Iterator

import pytest

from tests.support import TINY
from tests.support.azure_server import FOREIGN_SETTINGS, AzureServer
from tests.support.s3_server import S3Server, _foreign_key, proxy

KINDS = ("s3", "azure")

#: ``refuse(method, path, headers)``: (HTTP status, error code) to answer instead of forwarding,
#: or None. ``path`` is the request's as sent (the query included).
Refuse = Callable[[str, str, object], "tuple[int, str] | None"]


@dataclass
class WrongCredentials:
    """What a test expects once credentials are wrong."""

    code: str
    """The store's error code, as the one-line error names it."""
    secrets: tuple[str, ...]
    """What must never appear in a message."""
    exchanges: list[tuple[str, str, int]] = field(default_factory=list, repr=False)
    """(method, path, status) of every request, filled as they go (a proxy's log)."""

    @property
    def denied(self) -> list[tuple[str, str, int]]:
        """The requests the store answered 403 (access denied) so far."""
        return [e for e in self.exchanges if e[2] == 403]


class Store:
    """A store's server, as the tests see it (see the module's docstring)."""

    kind: str
    """``s3`` or ``azure``."""
    scheme: str
    """The URL scheme modelinit writes it through: ``s3``, ``az``."""
    container: str
    """What the store calls what holds objects, as modelinit's messages name it."""
    endpoint_setting: str
    """The environment variable that says where the server is."""
    credential_prefix: str
    """What every credential setting of this store starts with (its messages name them)."""

    def __init__(self, server) -> None:
        self.server = server

    # -- environment ----------------------------------------------------------------------------
    @property
    def env(self) -> dict[str, str]:
        """What a subprocess (the CLI) needs to reach the server."""
        return dict(self.server.env)

    def activate(self, monkeypatch, **overrides: str) -> None:
        """This process's environment pointed at the server (``overrides`` replace settings),
        one retry per failed request."""
        for k, v in {**self.env, **overrides}.items():
            monkeypatch.setenv(k, v)
        monkeypatch.setattr("modelinit.bucket.RETRIES", 1)

    # -- prefixes and objects -------------------------------------------------------------------
    def new_container(self) -> str:
        raise NotImplementedError

    def new_prefix(self, name: str = "m") -> str:
        """A new empty bucket or container, and the URL of ``name`` in it."""
        return f"{self.scheme}://{self.new_container()}/{name}"

    def missing_container_url(self, name: str = "m") -> str:
        """The URL of ``name`` in a bucket or container that does not exist."""
        return f"{self.scheme}://no-such-{self.container}-{os.getpid()}/{name}"

    def split(self, url: str) -> tuple[str, str]:
        """(bucket or container, the prefix's key without a trailing slash)."""
        scheme, _, rest = url.partition("://")
        assert scheme == self.scheme, f"{url} is not a {self.kind} URL"
        container, _, prefix = rest.partition("/")
        return container, prefix.rstrip("/")

    def key(self, url: str, name: str) -> tuple[str, str]:
        container, prefix = self.split(url)
        return container, f"{prefix}/{name}" if prefix else name

    def objects(self, url: str) -> dict[str, bytes]:
        """Every object directly or below the prefix (names relative to it), with its bytes."""
        raise NotImplementedError

    def get(self, url: str, name: str) -> bytes:
        raise NotImplementedError

    def put(self, url: str, name: str, data: bytes) -> None:
        raise NotImplementedError

    def delete(self, url: str, name: str) -> None:
        """Delete the object (a missing one is fine)."""
        raise NotImplementedError

    def pending_uploads(self, url: str) -> list[str]:
        """Objects of the URL's bucket or container with an upload begun and never finished (S3:
        an open multipart upload; Azure: uncommitted blocks), sorted: names relative to the
        prefix, or ``/FULL/KEY`` for one outside it."""
        raise NotImplementedError

    def _relative(self, url: str, keys: list[str]) -> list[str]:
        _, prefix = self.split(url)
        start = f"{prefix}/" if prefix else ""
        return sorted(k[len(start):] if k.startswith(start) else f"/{k}" for k in keys)

    # -- stores that behave otherwise -----------------------------------------------------------
    @contextlib.contextmanager
    def refusing(self, monkeypatch, refuse: Refuse) -> Iterator[list[str]]:
        """This process's environment pointed at a loopback proxy in front of the server that
        answers the requests ``refuse`` names with its error and forwards the others unchanged.
        Yields the refused requests (``METHOD PATH``), filled as they come."""
        with self._proxied(monkeypatch, refuse) as p:
            yield p.refused

    @contextlib.contextmanager
    def _proxied(self, monkeypatch, refuse: Refuse, **overrides: str):
        with proxy(self.server.endpoint, refuse) as p:
            self.activate(monkeypatch, **{self.endpoint_setting: p.endpoint, **overrides})
            yield p

    @contextlib.contextmanager
    def unreachable(self, monkeypatch) -> Iterator[str]:
        """This process's environment pointed at a loopback port nobody listens on, no retries.
        Yields the setting that names the endpoint."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.activate(monkeypatch, **{self.endpoint_setting: f"http://127.0.0.1:{port}"})
        monkeypatch.setattr("modelinit.bucket.RETRIES", 0)
        yield self.endpoint_setting

    def wrong_credentials(self, monkeypatch) -> contextlib.AbstractContextManager[WrongCredentials]:
        """This process's environment holding credentials the store refuses (a context manager)."""
        raise NotImplementedError


class S3Store(Store):
    kind, scheme, container = "s3", "s3", "bucket"
    endpoint_setting, credential_prefix = "AWS_ENDPOINT_URL", "AWS_"
    server: S3Server

    def new_container(self) -> str:
        return self.server.new_bucket()

    def objects(self, url: str) -> dict[str, bytes]:
        bucket, prefix = self.split(url)
        return self.server.keys(bucket, f"{prefix}/" if prefix else "")

    def get(self, url: str, name: str) -> bytes:
        bucket, key = self.key(url, name)
        return self.server.admin.get_object(Bucket=bucket, Key=key)["Body"].read()

    def put(self, url: str, name: str, data: bytes) -> None:
        bucket, key = self.key(url, name)
        self.server.admin.put_object(Bucket=bucket, Key=key, Body=data)

    def delete(self, url: str, name: str) -> None:
        bucket, key = self.key(url, name)
        self.server.admin.delete_object(Bucket=bucket, Key=key)

    def pending_uploads(self, url: str) -> list[str]:
        return self._relative(url, self.server.pending_uploads(self.split(url)[0]))

    @contextlib.contextmanager
    def wrong_credentials(self, monkeypatch) -> Iterator[WrongCredentials]:
        """Another key pair. moto's server accepts any key, so a proxy in front of it refuses
        every key but the test's, as a real store would (403 InvalidAccessKeyId)."""
        wrong = {"AWS_ACCESS_KEY_ID": "AKIAWRONGKEY", "AWS_SECRET_ACCESS_KEY": "wrong-secret"}
        with self._proxied(monkeypatch, _foreign_key, **wrong) as p:
            yield WrongCredentials("InvalidAccessKeyId", tuple(wrong.values()), p.exchanges)


class AzureStore(Store):
    kind, scheme, container = "azure", "az", "container"
    endpoint_setting, credential_prefix = "AZURITE_BLOB_STORAGE_URL", "AZURE_"
    server: AzureServer

    def activate(self, monkeypatch, **overrides: str) -> None:
        for k in FOREIGN_SETTINGS:
            monkeypatch.delenv(k, raising=False)
        super().activate(monkeypatch, **overrides)

    def new_container(self) -> str:
        return self.server.new_container()

    def objects(self, url: str) -> dict[str, bytes]:
        container, prefix = self.split(url)
        return self.server.blobs(container, f"{prefix}/" if prefix else "")

    def get(self, url: str, name: str) -> bytes:
        return self.server.container(self.split(url)[0]).download_blob(self.key(url, name)[1]).readall()

    def put(self, url: str, name: str, data: bytes) -> None:
        container, key = self.key(url, name)
        self.server.container(container).upload_blob(key, data, overwrite=True)

    def delete(self, url: str, name: str) -> None:
        from azure.core.exceptions import ResourceNotFoundError

        container, key = self.key(url, name)
        with contextlib.suppress(ResourceNotFoundError):
            self.server.container(container).delete_blob(key)

    def pending_uploads(self, url: str) -> list[str]:
        return self._relative(url, self.server.uncommitted(self.split(url)[0]))

    @contextlib.contextmanager
    def wrong_credentials(self, monkeypatch) -> Iterator[WrongCredentials]:
        """Another account key (well-formed: 64 bytes in base64). Azurite checks SharedKey
        signatures itself (403 AuthorizationFailure); a pass-through proxy records its answers."""
        wrong = "A" * 86 + "=="
        with self._proxied(monkeypatch, lambda *request: None, AZURE_STORAGE_ACCOUNT_KEY=wrong) as p:
            yield WrongCredentials("AuthorizationFailure", (wrong,), p.exchanges)


def open_store(request, monkeypatch, kind: str) -> Store:
    """The ``kind`` store's server (started once per session), with this process's environment
    pointed at it."""
    if kind == "s3":
        store: Store = S3Store(request.getfixturevalue("s3_server"))
    elif kind == "azure":
        store = AzureStore(request.getfixturevalue("azure_server"))
    else:
        raise ValueError(f"no store {kind!r}; one of {KINDS}")
    store.activate(monkeypatch)
    return store


@pytest.fixture(params=KINDS, ids=KINDS)
def store(request, monkeypatch) -> Store:
    """Each store in turn (see the module's docstring); this process's environment points at it."""
    return open_store(request, monkeypatch, request.param)


@pytest.fixture()
def s3_store(request, monkeypatch) -> Store:
    """The S3 store alone (for a test that picks its stores by name)."""
    return open_store(request, monkeypatch, "s3")


@pytest.fixture()
def azure_store(request, monkeypatch) -> Store:
    """The Azure store alone (for a test that picks its stores by name)."""
    return open_store(request, monkeypatch, "azure")


#: The command line the CLI tests of the stores run (5 shards, the index, config.json).
CLI_ARGS = ["--seed", "3", "--max-shard-size", "200KB", "--quiet", "--device", "cpu"]


@pytest.fixture(name="spec")
def cli_spec(tmp_path) -> str:
    """A spec file (the tiny GPT-2) for the CLI. A test module takes it, with ``expected``, by
    importing ``cli_spec`` and ``cli_expected``."""
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(TINY["gpt2"]))
    return str(path)


@pytest.fixture(name="expected")
def cli_expected(tmp_path, spec) -> dict[str, bytes]:
    """The files one whole CLI run of ``spec`` with :data:`CLI_ARGS` writes into a fresh folder."""
    from modelinit.cli import main

    out = tmp_path / "expected"
    assert main(["init", spec, *CLI_ARGS, "--out", str(out)]) == 0
    return {p.name: p.read_bytes() for p in out.iterdir()}
