#!/usr/bin/env python3
"""systemd's side of the sd_notify protocol for bench/soak.sh: listens on
an AF_UNIX datagram socket (the daemon's $NOTIFY_SOCKET) and appends each
message to a log as `<unix time> <message>` (one line per field) until
SIGTERM."""
import os
import signal
import socket
import sys
import time

path, log = sys.argv[1], sys.argv[2]
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
try:
    os.unlink(path)
except FileNotFoundError:
    pass
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(path)
with open(log, "a", buffering=1) as f:
    while True:
        msg = s.recv(65536).decode(errors="replace")
        t = time.time()
        for line in msg.splitlines():
            f.write(f"{t:.3f} {line}\n")
