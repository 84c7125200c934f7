"""Where bytes come from: the sources that plan a request and stream a plan's files.

- :mod:`~modelinit.sources.protocol`: the Source protocol (plan, events, stream_files,
  tensors), full_plan and check_version;
- :mod:`~modelinit.sources.embedded`: EmbeddedSource, the server's service in-process (the one
  module here that imports ``modelinit_server``, inside functions);
- :mod:`~modelinit.sources.remote`: RemoteSource, modelinit servers over gRPC (retries, resumed
  streams, replicas);
- :mod:`~modelinit.sources.fanout`: each_file, a plan's files through one sink, several at once;
- :mod:`~modelinit.sources.stub`: the ModelInit stub whose data messages stay unparsed (zero copy).

Nothing here imports :mod:`modelinit.destinations`: a destination's sink comes in as a
:data:`~modelinit.handoff.Write`, and what flows out is :mod:`modelinit.handoff`'s.
"""
