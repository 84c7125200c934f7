"""What every command of the command line shares: the one-line error and the exit statuses."""
from __future__ import annotations

import sys


def _fail(message: str, code: int) -> int:
    message = " ".join(str(message).split())  # one line, whatever the message holds
    try:
        print(f"modelinit: error: {message}", file=sys.stderr)
    except (OSError, ValueError):  # stderr gone too
        pass
    return code


#: Exit status after the reader of stdout went away (``modelinit plan gpt2 | head -1``): 128 +
#: SIGPIPE, what a shell reports for a command killed by the broken pipe.
EXIT_BROKEN_PIPE = 141
