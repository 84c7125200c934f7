"""A real S3 server on loopback for the object-storage tests: moto's standalone server (Flask,
``moto[server]``), started on a free port the way s3fs's own tests run it; the tests talk to it
over HTTP with the real libraries (obstore, boto3, s3fs), never through mocked calls.

``s3_server`` (session): the endpoint, fake credentials and :meth:`S3Server.env`, the environment a
subprocess (the CLI) needs to reach it; ``s3_bucket``: a fresh, empty bucket per test (its URL).
``s3_no_checksums``: a loopback proxy in front of it that refuses any request carrying
``x-amz-checksum-*`` headers, as several S3-compatible stores do (boto3#4392);
``s3_checking_keys``: one that refuses any access key but the test's (moto accepts any).
:func:`proxy` is that proxy for any store: ``refuse(method, path, headers)`` picks the requests it
answers with an error instead of forwarding.
"""
from __future__ import annotations

import contextlib
import http.client
import http.server
import itertools
import os
import socketserver
import threading
from dataclasses import dataclass, field
from typing import Iterator

import pytest

REGION = "us-east-1"
KEYS = {"AWS_ACCESS_KEY_ID": "modelinit-test", "AWS_SECRET_ACCESS_KEY": "modelinit-test-secret"}
_names = itertools.count()


@dataclass
class S3Server:
    endpoint: str
    """``http://127.0.0.1:PORT``."""
    admin: object = field(repr=False)
    """A boto3 S3 client on the server (to create buckets, list uploads, corrupt objects)."""

    @property
    def env(self) -> dict[str, str]:
        """What a process needs to reach this server through the libraries' standard chain."""
        return {**KEYS, "AWS_REGION": REGION, "AWS_DEFAULT_REGION": REGION, "AWS_ENDPOINT_URL": self.endpoint,
                "AWS_ALLOW_HTTP": "true", "MODELINIT_STORE_RETRIES": "1"}

    def new_bucket(self) -> str:
        name = f"modelinit-test-{os.getpid()}-{next(_names)}"
        self.admin.create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        """Every object under ``prefix`` (relative names) with its bytes."""
        out = {}
        for page in self.admin.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for o in page.get("Contents", []):
                out[o["Key"][len(prefix):].lstrip("/")] = self.admin.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
        return out

    def pending_uploads(self, bucket: str) -> list[str]:
        """Keys with an open multipart upload."""
        return [u["Key"] for u in self.admin.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]


@pytest.fixture(scope="session")
def s3_server():
    pytest.importorskip("obstore")
    boto3 = pytest.importorskip("boto3")
    server_mod = pytest.importorskip("moto.server")
    from botocore.config import Config

    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    admin = boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=KEYS["AWS_ACCESS_KEY_ID"],
                         aws_secret_access_key=KEYS["AWS_SECRET_ACCESS_KEY"],
                         config=Config(request_checksum_calculation="when_required"))
    yield S3Server(endpoint, admin)
    server.stop()


@pytest.fixture()
def s3_env(s3_server, monkeypatch):
    """This process's environment pointed at the server (obstore and boto3 read it)."""
    for k, v in s3_server.env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr("modelinit.bucket.RETRIES", 1)
    return s3_server


@pytest.fixture()
def s3_bucket(s3_env) -> str:
    """A new empty bucket (its name); the environment points at the server."""
    return s3_env.new_bucket()


class _Proxy(http.server.BaseHTTPRequestHandler):
    """Forwards every request to the upstream server as it came (method, path with its query,
    headers, body), unless ``refuse(method, path, headers)`` names an error (HTTP status, error
    code) to answer instead, as a store that behaves otherwise would. The answer is the XML error
    body S3 and Azure Blob Storage both send (``<Error><Code>...``). Every exchange is logged."""

    upstream: tuple[str, int]
    refused: list[str]
    exchanges: list[tuple[str, str, int]]
    refuse: staticmethod
    protocol_version = "HTTP/1.1"

    watch = None
    """Optional: called with (method, path, headers, body) of every request before it is answered."""

    def _any(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.watch is not None:
            self.watch(self.command, self.path, self.headers, body)
        answer = self.refuse(self.command, self.path, self.headers)
        if answer is not None:
            self.refused.append(f"{self.command} {self.path}")
            status, code = answer
            self.exchanges.append((self.command, self.path, status))
            msg = f"<Error><Code>{code}</Code><Message>refused by the test proxy</Message></Error>".encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("x-ms-error-code", code)  # where Azure's clients look for the code
            self.send_header("Content-Length", str(len(msg)))
            self.end_headers()
            self.wfile.write(msg)
            return
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        conn.request(self.command, self.path, body=body, headers={k: v for k, v in self.headers.items()})
        r = conn.getresponse()
        data = r.read()
        self.exchanges.append((self.command, self.path, r.status))
        self.send_response(r.status)
        head = self.command == "HEAD"  # its Content-Length is the object's, and it has no body
        for k, v in r.getheaders():
            if k.lower() not in ("transfer-encoding", "connection") and (head or k.lower() != "content-length"):
                self.send_header(k, v)
        if not head:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if not head:
            self.wfile.write(data)
        conn.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

    def log_message(self, *args) -> None:
        pass


@dataclass
class Proxied:
    """A running test proxy: its endpoint and what it saw."""

    endpoint: str
    """``http://127.0.0.1:PORT``: point the client here instead of at the server."""
    refused: list[str]
    """``METHOD PATH`` of every request it refused."""
    exchanges: list[tuple[str, str, int]]
    """(method, path, status answered) of every request, refused or forwarded."""


@contextlib.contextmanager
def proxy(upstream: str, refuse, watch=None) -> "Iterator[Proxied]":
    """A loopback proxy in front of ``upstream`` (``http://HOST:PORT``) that refuses what
    ``refuse(method, path, headers)`` names (see :class:`_Proxy`), forwarding everything else
    unchanged: the path and the headers too, so a request stays signed as the client signed it
    (Azure's SharedKey covers the path, not the host); ``watch(method, path, headers, body)`` sees
    every request first. Any store, any test: stores.py uses it too."""
    refused: list[str] = []
    exchanges: list[tuple[str, str, int]] = []
    host, port = upstream.removeprefix("http://").split(":")
    handler = type("H", (_Proxy,), {"upstream": (host, int(port)), "refused": refused, "exchanges": exchanges,
                                    "refuse": staticmethod(refuse),
                                    "watch": staticmethod(watch) if watch is not None else None})
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield Proxied(f"http://127.0.0.1:{server.server_address[1]}", refused, exchanges)
    finally:
        server.shutdown()
        server.server_close()


def _checksum_headers(method: str, path: str, headers) -> "tuple[int, str] | None":
    if any(k.lower().startswith(("x-amz-checksum-", "x-amz-sdk-checksum")) for k in headers):
        return 400, "InvalidRequest"
    return None


def _foreign_key(method: str, path: str, headers) -> "tuple[int, str] | None":
    """moto's server accepts any key; a real store refuses one it does not know."""
    if f"Credential={KEYS['AWS_ACCESS_KEY_ID']}/" not in headers.get("Authorization", ""):
        return 403, "InvalidAccessKeyId"
    return None


def _conditional_put(method: str, path: str, headers) -> "tuple[int, str] | None":
    if "If-None-Match" in headers:
        return 501, "NotImplemented"
    return None


@contextlib.contextmanager
def _proxied(s3_server, monkeypatch, refuse, watch=None):
    """This process's environment pointed at a :func:`proxy` in front of ``s3_server``; yields
    (server, refused requests)."""
    with proxy(s3_server.endpoint, refuse, watch) as p:
        for k, v in {**s3_server.env, "AWS_ENDPOINT_URL": p.endpoint}.items():
            monkeypatch.setenv(k, v)
        monkeypatch.setattr("modelinit.bucket.RETRIES", 1)
        yield s3_server, p.refused


@pytest.fixture()
def s3_no_checksums(s3_server, monkeypatch):
    """The server behind a proxy that refuses checksum headers, as several S3-compatible stores
    do (boto3#4392); the environment points at the proxy. Yields (server, refused requests)."""
    with _proxied(s3_server, monkeypatch, _checksum_headers) as got:
        yield got


@pytest.fixture()
def s3_no_conditional_put(s3_server, monkeypatch):
    """The server behind a proxy that answers 501 NotImplemented to a conditional PUT
    (``If-None-Match``), as S3-compatible stores without conditional writes do."""
    with _proxied(s3_server, monkeypatch, _conditional_put) as got:
        yield got


@pytest.fixture()
def s3_checking_keys(s3_server, monkeypatch):
    """The server behind a proxy that refuses (403 InvalidAccessKeyId) any key but the test's."""
    with _proxied(s3_server, monkeypatch, _foreign_key) as got:
        yield got


@pytest.fixture()
def s3_parts_seen(s3_server, monkeypatch):
    """The server behind a proxy that refuses nothing and keeps, for every part uploaded (a PUT
    with ``partNumber``), its headers and body. Yields (server, [(headers, body)])."""
    parts: list[tuple[dict, bytes]] = []

    def watch(method, path, headers, body) -> None:
        if method == "PUT" and "partNumber=" in path:
            parts.append(({k.lower(): v for k, v in headers.items()}, body))

    with _proxied(s3_server, monkeypatch, lambda *a: None, watch) as (server, _):
        yield server, parts
