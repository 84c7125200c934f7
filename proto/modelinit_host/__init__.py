"""modelinit_host: the tuning of the process this code runs in, on the host it runs on.

Neither wire format nor service logic: what a streaming process asks of its host. The client
(``modelinit``) and the server (``modelinit_server``) both import it; it imports neither, nor
``modelinit_wire`` (pyproject.toml's import-linter contracts check it). It holds:

    heap          glibc's heap taught to keep a stream's megabyte blocks (server, remote clients)
    usable_cores  the cores this process may use (affinity, cgroup quota): the kernels' threads,
                  the files a job or a verify takes on at once

This ``__init__`` imports nothing.
"""
