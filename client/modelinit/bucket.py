"""An object-store prefix (``s3://bucket/prefix``, ``gs://``, ``az://``) as a flat folder of objects.

Everything goes through obstore (the Python binding of Rust's ``object_store``; the ``cloud``
extra): credentials and endpoint come from its standard chain (``AWS_*`` environment variables,
instance and workload identity (IRSA, GKE/Azure workload identity); named AWS profiles are not read:
``aws configure export-credentials --format env``; ``AWS_ENDPOINT_URL`` for S3-compatible stores,
``AWS_ALLOW_HTTP=true`` for a plain-HTTP one). It was measured against fsspec/s3fs on the same S3
server (docs/object_storage.md): about half the client CPU per GB, memory bounded by the parts in
flight, and it aborts its multipart upload when the data source fails. What it cannot do is list
the multipart uploads a killed process left open; on ``s3://`` that one call goes through boto3
(also in the extra), asking for no checksum headers the store does not require (S3-compatible
stores reject them: boto3#4392).

A shard is one multipart upload (:data:`PART_BYTES` per part, :data:`PARTS_IN_FLIGHT` at once), so
an object exists only once complete. Every store error becomes one ModelInitError naming the
URL and what to do; no credential ever reaches a message (only the store's error code is kept).
"""
from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, NoReturn

import grpc

from . import store_secrets
from .errors import ModelInitError

log = logging.getLogger("modelinit.client")

#: URL schemes written through the object store (file:// is a local folder: modelinit.destinations.folder).
SCHEMES = ("s3", "gs", "az", "azure", "abfs", "abfss")
PART_BYTES = 16 << 20
"""Bytes per uploaded part: S3 allows 5 MiB-5 GiB and 10,000 parts, so 16 MiB parts take shards up
to 156 GiB, and 8 in flight keep a 10 Gb/s link busy."""
PARTS_IN_FLIGHT = 8
"""Parts uploaded at once per shard: memory is at most PART_BYTES x PARTS_IN_FLIGHT (128 MiB)."""
RETRIES = int(os.environ.get("MODELINIT_STORE_RETRIES", "5"))
"""Retries of a failed store request (backoff 0.2 s doubling, at most 10 s apart): a lost
connection or a 5xx is ridden out; an endpoint that never answers fails in about 6 s."""
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_EXTRA = "install modelinit with the 'cloud' extra (from a clone: pip install -e '.[cloud]'; docs/install.md)"
#: What S3-compatible stores answer to checksum headers they do not know (boto3#4392).
_CHECKSUM_REFUSALS = {"InvalidRequest", "NotImplemented", "InvalidArgument", "XAmzContentSHA256Mismatch",
                      "400 Bad Request", "501 Not Implemented"}


def url_scheme(path: str | os.PathLike) -> str | None:
    """The lower-case scheme of a URL (``s3``), None for a plain path."""
    text = os.fspath(path)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    m = _URL.match(text)
    return m.group(1).lower() if m else None


def is_bucket_url(path: str | os.PathLike) -> bool:
    """Whether ``path`` names an object-store prefix this module writes."""
    return url_scheme(path) in SCHEMES


def e_tag_of(raw: object) -> str:
    """An e_tag in the one form every comparison uses: without the quotes and the weak marker
    (``W/``) of HTTP's ETag syntax. Stores do not agree on them: Azure quotes the ETag header of an
    upload but not the ``Etag`` element of a listing (List Blobs); S3 quotes both; obstore's local
    store quotes neither. Compared as written, an object would never match its own upload."""
    text = str(raw or "").strip()
    if text.startswith("W/"):
        text = text[2:]
    if len(text) >= 2 and text[0] == text[-1] == '"':
        text = text[1:-1]
    return text


#: Store error codes (S3 and GCS's XML API; Azure) by what they mean to a user.
_MISSING_CONTAINER = ("NoSuchBucket", "ContainerNotFound", "FilesystemNotFound")
_DENIED = ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled",
           "AuthenticationFailed", "AuthorizationFailure", "AuthorizationPermissionMismatch",
           "AuthorizationSourceIPMismatch", "AuthorizationProtocolMismatch", "InsufficientAccountPermissions",
           "InvalidAuthenticationInfo", "NoAuthenticationInformation", "AccountIsDisabled")
_EXPIRED = ("ExpiredToken", "TokenRefreshRequired", "ExpiredTokenException")
#: Words of a transport failure (obstore's message), each kept as the error's code.
_UNREACHABLE = ("Connection refused", "dns error", "timed out", "certificate", "connection closed")


@dataclass(frozen=True)
class StoreSettings:
    """What a store calls the things its errors are about, for hints that name its own settings."""

    container: str
    """What holds the objects: ``bucket`` (S3, GCS) or ``container`` (Azure)."""
    credentials: str
    """The settings that give credentials, and where permissions are granted."""
    endpoint: str
    """The settings that say where the store is."""


def store_settings(scheme: str) -> StoreSettings:
    """The settings obstore reads for ``scheme``'s store (its documented environment variables)."""
    if scheme in ("az", "azure", "abfs", "abfss"):
        emulator = os.environ.get("AZURE_STORAGE_USE_EMULATOR", "").lower() in ("1", "true")
        return StoreSettings(
            "container",
            "AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_KEY, a service principal "
            "(AZURE_CLIENT_ID, AZURE_TENANT_ID, AZURE_CLIENT_SECRET) or workload identity (AZURE_FEDERATED_TOKEN_FILE); "
            "and the role assignment, e.g. Storage Blob Data Contributor",
            "AZURITE_BLOB_STORAGE_URL (AZURE_STORAGE_USE_EMULATOR is set)" if emulator
            else "AZURE_STORAGE_ACCOUNT_NAME / AZURE_STORAGE_ENDPOINT")
    if scheme == "gs":
        return StoreSettings("bucket", "GOOGLE_APPLICATION_CREDENTIALS or GOOGLE_SERVICE_ACCOUNT, or workload identity; "
                                       "and the bucket's IAM roles", "GOOGLE_BASE_URL")
    if scheme == "file":
        return StoreSettings("folder", "the folder's permissions", "the path")
    return StoreSettings("bucket", "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or workload identity; and the bucket policy",
                         "AWS_ENDPOINT_URL")


@dataclass(frozen=True)
class ObjectInfo:
    """An object under the prefix."""

    name: str
    """Its key relative to the prefix."""
    size: int
    e_tag: str
    """Changes whenever the object is rewritten: a recorded e_tag that still matches is the same
    object this client uploaded. Always in :func:`e_tag_of`'s form."""


def _obstore() -> Any:
    try:
        import obstore
    except ImportError:
        raise ModelInitError(grpc.StatusCode.FAILED_PRECONDITION,
                             f"writing to object storage needs the object-store extra: {_EXTRA}") from None
    return obstore


def _code(e: BaseException) -> str:
    """The store's error code or HTTP status from an obstore or boto3 error, nothing else (no URLs
    with signatures, no keys)."""
    response = getattr(e, "response", None)  # botocore's ClientError
    if isinstance(response, dict) and response.get("Error", {}).get("Code"):
        return str(response["Error"]["Code"])
    text = str(e)
    m = re.search(r"<Code>([A-Za-z]+)</Code>", text)
    if m:
        return m.group(1)
    m = re.search(r"(\d{3} [A-Z][A-Za-z ]+?)[:,\n]", text)
    if m:
        return m.group(1)
    for word in _UNREACHABLE:
        if word.lower() in text.lower():
            return word
    return type(e).__name__


#: The hosts of ``abfs[s]://CONTAINER@ACCOUNT.HOST/...`` (ADLS Gen2 and Fabric, as obstore parses them).
_AZURE_ACCOUNT_HOST = re.compile(r"^([a-z0-9]{3,24})\.(?:dfs|blob)\.(?:core\.windows\.net|fabric\.microsoft\.com)$")


def _azure_container_at_account(scheme: str, authority: str, field: str) -> tuple[str, str]:
    """``CONTAINER@ACCOUNT.dfs.core.windows.net`` (abfs/abfss only): the container and the account.
    Any other userinfo is refused without echoing it: it would be a secret that reaches logs,
    errors and modelinit.json."""
    userinfo, _, host = authority.rpartition("@")
    m = _AZURE_ACCOUNT_HOST.match(host.lower())
    if scheme in ("abfs", "abfss") and m is not None and userinfo and ":" not in userinfo and "@" not in userinfo:
        return userinfo, m.group(1)
    if scheme in ("abfs", "abfss") and userinfo and ":" not in userinfo:
        raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT,
                             f"{field}: {scheme}://CONTAINER@HOST takes an account's endpoint as HOST "
                             "(ACCOUNT.dfs.core.windows.net, ACCOUNT.blob.core.windows.net or ACCOUNT.dfs.fabric.microsoft.com)")
    raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT,
                         f"{field}: credentials in the URL are not taken (they would be logged); give "
                         f"{scheme}://{store_settings(scheme).container.upper()}/PREFIX and the credentials through the "
                         "environment or a profile")


def _owned(data) -> bytes | memoryview:
    """The buffer's bytes, owned. obstore keeps the buffers it is given, without copying, until
    their part is sent, while the embedded engine reuses its segment buffers a few events later
    (``ring``): uploading a view would send whatever the buffer holds by then (the SHA-256, taken
    as the bytes passed, would not notice). ``bytes``, or a view of ``bytes`` (what gRPC gives,
    :mod:`modelinit.sources.stub`), is immutable: no copy."""
    if isinstance(data, bytes) or (isinstance(data, memoryview) and isinstance(data.obj, bytes)):
        return data
    return bytes(memoryview(data).cast("B"))


class Bucket:
    """A prefix of a bucket: list, read, write and delete the objects directly under it."""

    def __init__(self, url: str, field: str = "out_dir") -> None:
        obstore = _obstore()
        from datetime import timedelta

        self.url = url.rstrip("/")
        self.field = field
        self.scheme = url_scheme(url) or ""
        self.bucket, _, self.prefix = self.url.split("://", 1)[1].partition("/")
        self.account: str | None = None
        """The Azure storage account a URL names in its host (``abfss://CONTAINER@ACCOUNT.dfs.core.windows.net``)."""
        if "@" in self.bucket:
            self.bucket, self.account = _azure_container_at_account(self.scheme, self.bucket, field)
        settings = store_settings(self.scheme)
        if not self.bucket and self.scheme != "file":
            raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"{field}: {url!r} names no {settings.container}; write {self.scheme}://{settings.container.upper()}/PREFIX")
        self._obstore = obstore
        self._admin: Any = None  # boto3's S3 client, made on first use (S3 only)
        self._retry = {"max_retries": RETRIES, "retry_timeout": timedelta(minutes=3),
                       "backoff": {"init_backoff": timedelta(milliseconds=200), "max_backoff": timedelta(seconds=10), "base": 2}}
        # A per-part checksum the store verifies as it stores (S3), off when it refuses them: CRC64NVME,
        # which S3 also combines into a full-object checksum, at a fraction of a SHA-256 pass's CPU.
        self.checksums = self.scheme == "s3" and os.environ.get("MODELINIT_STORE_CHECKSUMS", "1") != "0"
        self._secrets = store_secrets.read(self.scheme)
        """This store's settings from the files of MODELINIT_STORE_SECRETS (over the environment's)."""
        self.store = self._open()

    def _open(self) -> Any:
        options: dict[str, Any] = {"checksum_algorithm": "crc64nvme"} if self.checksums else {}
        options.update(store_secrets.obstore_options(self._secrets))
        try:
            return self._obstore.store.from_url(self.url, retry_config=self._retry, **options)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # a malformed URL or configuration (obstore's own types; a Rust panic is a BaseException)
            unknown = re.search(r"Configuration key: '(\w+)' is not valid", str(e))
            if unknown and unknown.group(1).upper() in self._secrets:
                raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT,
                                     f"{store_secrets.ENV}: {unknown.group(1).upper()} is no setting of the {self.scheme}:// "
                                     "store (obstore does not know it): check its name") from None
            text = store_secrets.redact(" ".join(str(e).split()), self._secrets)[:200]
            raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, f"{self.field}: cannot use {self.url}: {text}") from None

    def __str__(self) -> str:
        return self.url

    # -- errors ---------------------------------------------------------------------------------
    def error(self, e: BaseException, doing: str) -> ModelInitError:
        """A store error as one ModelInitError: the URL, what was being done, the store's code and
        the likely fix, in the settings of this URL's store (:func:`store_settings`)."""
        code = _code(e)
        where = f"{self.url}: {doing}"
        settings = store_settings(self.scheme)
        if self._secrets:  # say where the settings in use came from
            files = f"{', '.join(self._secrets)} from the files of {store_secrets.ENV}={os.environ.get(store_secrets.ENV)}"
            settings = StoreSettings(settings.container, f"{settings.credentials}; {files}", f"{settings.endpoint}; {files}")
        if code in _MISSING_CONTAINER:
            return ModelInitError(grpc.StatusCode.NOT_FOUND,
                                  f"{where}: {settings.container} {self.bucket!r} does not exist (create it, or fix the URL)")
        if code in _DENIED or code.startswith("403"):
            return ModelInitError(grpc.StatusCode.PERMISSION_DENIED,
                                  f"{where}: access denied ({code}): check the credentials ({settings.credentials})")
        if code in _EXPIRED or code.startswith("401"):
            return ModelInitError(grpc.StatusCode.UNAUTHENTICATED,
                                  f"{where}: credentials expired or refused ({code}): refresh them ({settings.credentials})")
        if code in _UNREACHABLE:
            return ModelInitError(grpc.StatusCode.UNAVAILABLE,
                                  f"{where}: cannot reach the store ({code}); check {settings.endpoint} / the network")
        if type(e).__name__ in ("UnauthenticatedError",):
            return ModelInitError(grpc.StatusCode.UNAUTHENTICATED,
                                  f"{where}: no usable credentials ({code}): set {settings.credentials}")
        if type(e).__name__ in ("PermissionDeniedError",):
            return ModelInitError(grpc.StatusCode.PERMISSION_DENIED,
                                  f"{where}: permission denied ({code}): check the credentials ({settings.credentials})")
        return ModelInitError(grpc.StatusCode.UNAVAILABLE, f"{where}: the store refused the request ({code})")

    def _call(self, doing: str, fn, *args, retry_plain: bool = True, **kwargs):
        """``fn(store, *args, **kwargs)``, its errors translated. A request refused for its
        checksum headers (S3-compatible stores that predate them) is sent again without them,
        once, and the store is used without them from then on (``retry_plain``: the request can
        be sent again, its data is not a one-shot iterator)."""
        try:
            return fn(self.store, *args, **kwargs)
        except Exception as e:
            if not (self.checksums and retry_plain and _code(e) in _CHECKSUM_REFUSALS):
                return self._translate(e, doing)
            self.checksums = False
            self.store = self._open()
            log.warning("%s: the store refused checksum headers (%s); uploading without per-part checksums "
                        "(every shard's SHA-256 is still checked end to end)", self.url, _code(e))
        try:
            return fn(self.store, *args, **kwargs)
        except Exception as e:
            return self._translate(e, doing)

    def _translate(self, e: Exception, doing: str) -> NoReturn:
        """Re-raise ``e``: a store error as :meth:`error`'s ModelInitError; a missing object
        (FileNotFoundError) and anything not from the store as it is."""
        missing_object = isinstance(e, FileNotFoundError) and not any(c in str(e) for c in _MISSING_CONTAINER)
        if isinstance(e, (ModelInitError, FileExistsError)) or missing_object:
            raise e
        if type(e).__module__.startswith("obstore") or isinstance(e, (OSError, ConnectionError)):
            raise self.error(e, doing) from None
        raise e

    # -- objects --------------------------------------------------------------------------------
    def list(self) -> dict[str, ObjectInfo]:
        """The objects directly under the prefix (not in "subfolders"), by name."""
        result = self._call("listing the prefix", self._obstore.list_with_delimiter)
        return {m["path"]: ObjectInfo(m["path"], m["size"], e_tag_of(m.get("e_tag"))) for m in result["objects"]}

    def read(self, name: str, limit: int | None = None) -> bytes | None:
        """The whole object (small ones: records, the manifest), None when it is not there.
        ``limit``: an object of more bytes is refused unread (FAILED_PRECONDITION)."""
        try:
            result = self._call(f"reading {name}", self._obstore.get, name)
        except FileNotFoundError:
            return None
        size = result.meta["size"]
        if limit is not None and size > limit:
            raise ModelInitError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"{self.url}/{name}: {size} bytes, larger than the {limit} it may be; not read "
                                 "(damaged, or not modelinit's)")
        try:
            return bytes(result.bytes())
        except Exception as e:  # the body is read here, after the request
            raise self.error(e, f"reading {name}") from None

    def chunks(self, name: str) -> Iterator[memoryview]:
        """The object's bytes, streamed (verify, rehash)."""
        result = self._call(f"reading {name}", self._obstore.get, name)
        try:
            for chunk in result:
                yield memoryview(chunk)
        except Exception as e:
            raise self.error(e, f"reading {name}") from None

    def put(self, name: str, data: bytes, create: bool = False) -> str:
        """A small object in one request; ``create``: only if no object has the name (raises
        FileExistsError when one has, or when another writer's create of it is under way). The
        new e_tag."""
        exceptions = self._obstore.exceptions

        def attempt(store: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return self._obstore.put(store, *args, **kwargs)
            except (exceptions.AlreadyExistsError, exceptions.PreconditionError):
                raise FileExistsError(name) from None

        result = self._call(f"writing {name}", attempt, name, data, mode="create" if create else "overwrite",
                            use_multipart=False)
        return e_tag_of(result.get("e_tag"))

    def upload(self, name: str, chunks: Iterable[Any]) -> str:
        """A shard as one multipart upload of ``chunks`` (buffers, in order): the object appears only
        once every part is in; when ``chunks`` raises, the upload is aborted and the error re-raised
        (no object, no parts left). The new e_tag (:func:`e_tag_of`'s form)."""
        result = self._call(f"uploading {name}", self._obstore.put, name, (_owned(c) for c in chunks), retry_plain=False,
                            use_multipart=True, chunk_size=PART_BYTES, max_concurrency=PARTS_IN_FLIGHT)
        return e_tag_of(result.get("e_tag"))

    def delete(self, name: str) -> None:
        """Delete the object (a missing one is fine). obstore deletes through S3's bulk
        DeleteObjects, which always carries a checksum header: on a store that refuses those,
        the plain DeleteObject goes through boto3 instead."""
        if self.scheme == "s3" and not self.checksums and (client := self._s3_admin()) is not None:
            try:
                client.delete_object(Bucket=self.bucket, Key=self._key(name))
                return
            except Exception as e:
                raise self.error(e, f"deleting {name}") from None
        try:
            self._call(f"deleting {name}", self._obstore.delete, name)
        except FileNotFoundError:
            pass

    # -- multipart uploads a killed process left ------------------------------------------------
    def abort_pending(self, names: Iterable[str]) -> int:
        """Abort the open multipart uploads of ``names`` (a process killed mid-upload leaves its
        parts stored and billed, invisible). S3 only (boto3); elsewhere the store's own expiry
        applies. How many were aborted."""
        wanted = {self._key(n) for n in names}
        if self.scheme != "s3" or not wanted:
            return 0
        client = self._s3_admin()
        if client is None:
            return 0
        aborted = 0
        try:
            pages = client.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket, Prefix=self._key(""))
            for page in pages:
                for upload in page.get("Uploads", []):
                    if upload["Key"] in wanted:
                        client.abort_multipart_upload(Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"])
                        aborted += 1
        except Exception as e:  # listing uploads is an extra permission some roles lack: say so, go on
            log.warning("%s: cannot list or abort open multipart uploads (%s); a bucket lifecycle rule "
                        "AbortIncompleteMultipartUpload removes them", self.url, _code(e))
        return aborted

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _s3_admin(self) -> Any:
        if self._admin is not None:
            return self._admin
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            log.warning("%s: boto3 is missing, so open multipart uploads of a killed run are not aborted (%s)", self.url, _EXTRA)
            return None
        # Only the checksums the store requires: S3-compatible stores reject the newer default ones.
        config = Config(request_checksum_calculation="when_required", response_checksum_validation="when_required",
                        retries={"max_attempts": 3, "mode": "standard"})
        self._admin = boto3.client("s3", config=config, **store_secrets.boto3_arguments(self._secrets))
        return self._admin
