"""modelinit_wire: what the client (``modelinit``) and the server (``modelinit_server``) share.

Both sides import this package; it imports neither (pyproject.toml's import-linter contracts
check it). It holds:

    v1           the generated messages and stubs of proto/modelinit/v1/modelinit.proto
                 (``modelinit.v1`` re-exports them for callers)
    constants    values both sides agree on: dtypes, devices, algorithm versions, the
                 server's default limits
    events       a stream of files as producer and writer see it (Begin, Data, End)
    credentials  TLS/mTLS channel credentials, bearer tokens, PEM reading
    policy_file  the policy text format (JSON/YAML <-> the ``Policy`` message)
    data_message a data message's wire bytes: encoded by the server, read in place by the client
    spec_argument the spec a caller gives (preset, config path, dict), read by one rule both sides
    sizes        ``5GB``, ``2GiB``: the size grammar of max_shard_size and the CLI's size flags
    quoting      short excerpts of hostile values for error messages

This ``__init__`` imports nothing, so ``modelinit_wire.constants`` costs no grpc import.
"""
