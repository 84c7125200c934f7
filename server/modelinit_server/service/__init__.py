"""The service: the gRPC adapter around the core, and the same adapter in-process.

    server         lifecycle: build the grpc.aio server, health, serve until SIGTERM; BackgroundServer
    servicer       the ModelInit methods: requests -> core, streams -> messages; errors -> status codes
    embedded       EmbeddedService: the servicer's work in-process, for ``modelinit.Client()``
    command        ``modelinit serve``: flags -> ServerConfig -> server
    security       TLS/mTLS credentials and the bearer-token interceptor
    limits         the operator's caps on a request's size
    malformed      undecodable requests -> INVALID_ARGUMENT
    observability  Prometheus metrics, structured logs with request ids

May import everything below it (training excepted): produce, messages, architectures, core, engine.
"""
