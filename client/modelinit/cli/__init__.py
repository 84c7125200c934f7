"""The `modelinit` command line: serve, init, finalize, plan, explain, job, probe, verify, versions.

    serve      run the gRPC server (needs the server extra)
    init       write a model's initialized weights into a folder or an object-store prefix
               (--part K/N: one part of N; --ray N: N parts as Ray tasks)
    finalize   after `init --part K/N` of every part: the index, config.json and modelinit.json
    plan       every tensor's rule, std and shard, nothing generated (--parts N: the split)
    explain    tensor groups with their std against the Xavier/LeCun references, and warnings
    job        print the Kueue-admitted Kubernetes Indexed Job whose N pods write one checkpoint
    probe      one measured forward and backward pass of the model filled with a policy's bytes;
               with --widths, the coordinate check over widths and steps (needs the server and probe extras)
    verify     check a finished folder or prefix against its modelinit.json (and, unless told
               not to, regenerate its bytes)
    versions   the installed versions that decide the bytes and the stacks found (for a bug report)

Without --server, init, finalize, plan, explain and verify run embedded: an in-process server on
the same code path.
Errors print one line (`modelinit: error: ...`) and exit non-zero (2 for bad input).

The package: ``entry`` (main, the console script) over ``parser`` (the flags, each command's
handler as ``func``) over ``commands`` (one handler per command) over ``output`` (what plan and
explain print) and ``common`` (the one-line error, the exit statuses).
"""
from __future__ import annotations

from .commands import EXIT_PARTS_MISSING, REQUEST_FLAGS, connect
from .common import EXIT_BROKEN_PIPE
from .entry import main, run
from .output import explain_summary, policy_title
from .parser import build_parser, version_line

__all__ = ["EXIT_BROKEN_PIPE", "EXIT_PARTS_MISSING", "REQUEST_FLAGS", "build_parser", "connect", "explain_summary", "main",
           "policy_title", "run", "version_line"]
