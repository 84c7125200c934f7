"""The bytes of a plan, produced on demand in bounded segments through an engine backend.

    file_bytes     every file of a plan (shards: header + tensor data; JSON files), any byte range
    tensor_slices  n-d slices of named tensors, without the files (the ``Tensors`` RPC)
    digests        the SHA-256s of the shards a process has produced whole (a server hashes each shard once)

May import: core, engine, and modelinit_wire's events and messages. Not grpc: the service
streams what these yield.
"""
