"""The fixtures every test folder sees: a real in-process server on a free port (session) and the
real client, `modelinit serve` in subprocesses, and the fixtures of tests/support registered here
by import (object stores, the hostile server, the medium model's reference run). Helpers and data
are in tests/support, never here.

Hooks shape a run (tests/README.md, "Running them"): the tests marked ``slow`` are handed out
first, so that the parallel workers (pytest-xdist) end together instead of one of them finishing a
long test alone; the installs the tests need start in the background as the run begins, and the
numba kernels compile once for the whole run before the workers' first tests; and the run ends
with its slowest tests, so that growth is seen where it happens."""
from __future__ import annotations

import os
import sys

import modelinit
import pytest
from modelinit_server.service.server import BackgroundServer, ServerConfig

from tests.support import ServerProcess, installs, kernels
from tests.support.durations import Durations
from tests.support.azure_server import azure_container, azure_env, azure_server  # noqa: F401 - fixtures
from tests.support.hostile_server import hostile  # noqa: F401 - fixture
from tests.support.medium_model import reference  # noqa: F401 - fixture
from tests.support.preforked import preforked  # noqa: F401 - fixture
from tests.support.relay import relay  # noqa: F401 - fixture
from tests.support.s3_server import (  # noqa: F401 - fixtures
    s3_bucket, s3_checking_keys, s3_env, s3_no_checksums, s3_no_conditional_put, s3_parts_seen, s3_server)
from tests.support.stores import azure_store, s3_store, store  # noqa: F401 - fixtures


def pytest_collection_modifyitems(config, items):
    """The ``slow`` tests first, each group in its order of collection (a stable sort), and in each
    group those that need an install last (tests/support/installs.py starts them in the background);
    the ``reads_parts`` tests at the very end (what they read is made by other tests: handed out
    earlier, a worker would wait there while the other makes the last part)."""
    items.sort(key=lambda item: (item.get_closest_marker("reads_parts") is not None, item.get_closest_marker("slow") is None,
                                 installs.needs_install(item.nodeid)))


def pytest_collection_finish(session):
    if not hasattr(session.config, "workerinput") and session.config.pluginmanager.get_plugin("dsession") is None:
        installs.start(item.nodeid for item in session.items)  # -n 0: this process is the run


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    installs.start(ids)  # the xdist controller: the first worker's collection names the run's tests


def pytest_unconfigure(config):
    installs.finish()


def pytest_configure(config):
    # The project's own modules compiled once per run, not once per process: the suite starts
    # hundreds of interpreters (the CLI, the docs' blocks, the benchmarks, servers), and where
    # PYTHONDONTWRITEBYTECODE is set (CI's machines set it) each would compile modelinit again
    # (about 0.3 s). The bytecode goes to __pycache__ folders, which git ignores.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
    if not hasattr(config, "workerinput"):  # the run's own process: the one that prints
        config.pluginmanager.register(Durations(), "modelinit-durations")
        if getattr(config.option, "numprocesses", None):  # before any worker exists (tests/support/kernels.py)
            kernels.warm_in_background()


@pytest.fixture(scope="session", autouse=True)
def _kernels_compiled_once():
    """A worker's first test waits for the controller's numba warm-up (tests/support/kernels.py)."""
    kernels.wait()


@pytest.fixture(scope="session")
def server_target():
    server = BackgroundServer()
    yield server.target
    server.stop()


@pytest.fixture()
def background_server():
    """Starts real in-process servers of this test's own: ``background_server(**ServerConfig fields)``
    (loopback, a free port unless given); all stopped at the test's end."""
    servers: list[BackgroundServer] = []

    def start(**config) -> BackgroundServer:
        servers.append(BackgroundServer(ServerConfig(**{"host": "127.0.0.1", "port": 0, **config})))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()


@pytest.fixture(scope="module")
def embedded():
    """An embedded client (no server: the engine in this process), one per test module."""
    with modelinit.Client() as c:
        yield c


@pytest.fixture()
def client(server_target):
    with modelinit.Client(server_target) as c:
        yield c


@pytest.fixture()
def server_process():
    procs = []

    def start(*extra: str) -> ServerProcess:
        procs.append(ServerProcess(*extra))
        return procs[-1]

    yield start
    for p in procs:
        p.stop()
