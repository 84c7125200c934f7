"""modelinit_server: the engine, architectures, policies, shard writer and gRPC server of modelinit.

The numerical core (engine, architectures, policies, planner, files) imports no grpc; only
`servicer`, `convert` and `server` do.
"""
