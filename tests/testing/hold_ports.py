#!/usr/bin/env python3
"""Holds N loopback ports for a test script, so that no port is ever guessed.

Usage: read -r HOLDER PORTS... < <(python3 hold_ports.py OWNER_PID N)

Binds N sockets to 127.0.0.1:0 with SO_REUSEADDR and never listens. While they stay bound the
kernel hands those ports to nobody else (neither bind(0) nor connect()'s source port), a connect
to one is refused until someone listens there, and a server that also sets SO_REUSEADDR (Braid's
store does) can still bind and listen on it, since nobody else listens. Prints its pid and the
ports once all are bound (that line is the readiness signal), then keeps them until OWNER_PID
is gone.
"""
import os
import socket
import sys
import time

owner, n = int(sys.argv[1]), int(sys.argv[2])
held = []
for _ in range(n):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    held.append(s)
print(os.getpid(), *[s.getsockname()[1] for s in held], flush=True)
sys.stdout.close()
while True:  # polls for the owner's exit; nothing waits on this loop
    try:
        os.kill(owner, 0)
    except ProcessLookupError:
        break
    time.sleep(1)
