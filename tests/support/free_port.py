"""A free local TCP port, for a rendezvous a test starts (torchrun's master, a gloo group of
the vLLM workers). Trap: the port is free when asked, not reserved: another process may take
it before the rendezvous binds it (rare on a test machine; the run then fails naming it)."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
