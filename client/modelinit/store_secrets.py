"""Object-store credentials read from files: a Kubernetes Secret mounted as a folder.

``MODELINIT_STORE_SECRETS=/var/run/modelinit-store`` names a folder with one file per setting, each
named as the setting's environment variable (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_REGION``, ``AZURE_STORAGE_ACCOUNT_KEY``, ``GOOGLE_SERVICE_ACCOUNT_KEY``, ...) and holding its
value: what ``kubectl create secret generic --from-literal=NAME=VALUE`` gives when the Secret is
mounted as a volume. The settings of the URL's store (``AWS_*`` for ``s3://``, ``AZURE_*`` for
``az://``, ``GOOGLE_*`` for ``gs://``) are handed to obstore as its configuration, lower-cased (its
configuration takes the variables' names so: obstore 0.12's type stubs), and to boto3 where it
aborts a killed run's uploads. They override the same variables in the environment, which are
still read when there is no folder.

Why files: an environment variable is inherited by every child process (Ray workers, shells in
init containers) and can be read from /proc; a mounted file is read by this process alone, once,
and never enters the environment. A value never appears in a message.
"""
from __future__ import annotations

import os
import pathlib

import grpc

from .errors import ModelInitError

#: The environment variable naming the folder (unset or empty: no folder, the environment alone).
ENV = "MODELINIT_STORE_SECRETS"
#: What each store's settings start with, by URL scheme.
PREFIXES = {"s3": "AWS_", "gs": "GOOGLE_", "az": "AZURE_", "azure": "AZURE_", "abfs": "AZURE_", "abfss": "AZURE_"}
#: Largest file taken as a setting (a service-account key is a few KiB).
MAX_BYTES = 64 << 10


def _fail(code: grpc.StatusCode, text: str) -> ModelInitError:
    return ModelInitError(code, f"{ENV}: {text}")


def _value(path: pathlib.Path) -> str:
    name = path.name
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except IsADirectoryError:
        raise _fail(grpc.StatusCode.INVALID_ARGUMENT, f"{name} is a folder; each setting is a file holding its value") from None
    except OSError as e:
        raise _fail(grpc.StatusCode.FAILED_PRECONDITION, f"cannot read {name}: {e.strerror}") from None
    if len(raw) > MAX_BYTES:
        raise _fail(grpc.StatusCode.INVALID_ARGUMENT, f"{name} is over {MAX_BYTES // 1024} KiB; a setting's file holds its value alone")
    try:
        text = raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError:
        raise _fail(grpc.StatusCode.INVALID_ARGUMENT, f"{name} is not UTF-8 text") from None
    if not text.strip():
        raise _fail(grpc.StatusCode.INVALID_ARGUMENT, f"{name} is empty; remove it, or give it its value")
    return text


def read(scheme: str) -> dict[str, str]:
    """The settings of ``scheme``'s store from the folder, by variable name (``AWS_REGION``);
    empty when :data:`ENV` is unset. Every file must be a setting of some store (a misspelled name
    is an error, not a credential silently left out); those of other stores are skipped."""
    folder = os.environ.get(ENV, "")
    if not folder:
        return {}
    root = pathlib.Path(folder)
    if not root.is_dir():
        raise _fail(grpc.StatusCode.FAILED_PRECONDITION,
                    f"{folder!r} is not a folder; mount the Secret there, or unset {ENV} to use the environment")
    prefix = PREFIXES.get(scheme)
    known = tuple(sorted(set(PREFIXES.values())))
    out: dict[str, str] = {}
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as e:
        raise _fail(grpc.StatusCode.FAILED_PRECONDITION, f"cannot list {folder!r}: {e.strerror}") from None
    for entry in entries:
        if entry.name.startswith("."):  # a mounted Secret's own ..data link and timestamped folder
            continue
        if not entry.name.startswith(known) or not entry.name.replace("_", "").isalnum():
            raise _fail(grpc.StatusCode.INVALID_ARGUMENT,
                        f"{entry.name!r} in {folder!r} is no store setting; name each file as the setting's "
                        f"environment variable ({', '.join(p + '...' for p in known)})")
        if prefix and entry.name.startswith(prefix):
            out[entry.name] = _value(pathlib.Path(entry.path))
    return out


#: obstore's client options (its ``ClientConfig``: obstore 0.12.1's type stubs), which the environment
#: gives with the store's prefix (``AWS_ALLOW_HTTP``) but obstore takes apart from its configuration and
#: without the prefix (given in the configuration, obstore 0.12.1 panics).
CLIENT_OPTIONS = ("allow_http", "allow_invalid_certificates", "connect_timeout", "default_content_type", "http1_only",
                  "http2_keep_alive_interval", "http2_keep_alive_timeout", "http2_keep_alive_while_idle", "http2_only",
                  "pool_idle_timeout", "pool_max_idle_per_host", "proxy_url", "proxy_ca_certificate", "proxy_excludes",
                  "randomize_addresses", "read_timeout", "timeout", "user_agent")


def obstore_options(settings: dict[str, str]) -> dict[str, dict[str, str]]:
    """``settings`` as obstore's keyword arguments: ``config`` (the variables' names lower-cased,
    which its configuration takes) and ``client_options`` (:data:`CLIENT_OPTIONS`, unprefixed)."""
    config: dict[str, str] = {}
    client: dict[str, str] = {}
    for name, value in settings.items():
        bare = name.split("_", 1)[1].lower()
        if bare in CLIENT_OPTIONS:
            client[bare] = value
        else:
            config[name.lower()] = value
    return {k: v for k, v in (("config", config), ("client_options", client)) if v}


def boto3_arguments(settings: dict[str, str]) -> dict[str, str]:
    """The S3 ``settings`` boto3's client takes as arguments."""
    names = {"AWS_ACCESS_KEY_ID": "aws_access_key_id", "AWS_SECRET_ACCESS_KEY": "aws_secret_access_key",
             "AWS_SESSION_TOKEN": "aws_session_token", "AWS_ENDPOINT_URL": "endpoint_url",
             "AWS_ENDPOINT_URL_S3": "endpoint_url", "AWS_DEFAULT_REGION": "region_name", "AWS_REGION": "region_name"}
    return {names[k]: v for k, v in sorted(settings.items()) if k in names}


def redact(text: str, settings: dict[str, str]) -> str:
    """``text`` with every value of ``settings`` replaced by ``***``."""
    for v in sorted(settings.values(), key=len, reverse=True):
        if len(v) >= 4:
            text = text.replace(v, "***")
    return text
