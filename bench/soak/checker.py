#!/usr/bin/env python3
"""Correctness checker for bench/soak.sh: a plain RESP client (no library)
that, alongside the load generator, keeps writing known values to a redis
server and reading them back, verifying every reply.

Per server (one thread each, HOST:PORT arguments), at about --rate
operations per second:
  - SET soak:check:<tag>:<n> <value>, then GET it back: the value must be
    byte-identical (values are derived from n: 16 B to 16 KiB, every 50th
    one 16 KiB);
  - every 10th round, GET one of the last 2,000 keys written (still the
    value written);
  - every 10th round, INCR soak:check:<tag>:counter: must be the previous
    reply + 1.
Every reply is checked (type and content); a connection error is an error
too (reconnects and goes on). On SIGTERM/SIGINT it writes one line per
server to --out and exits:
  server=HOST:PORT ops=N checked_values=N mismatches=N errors=N first_error=...
"""
import argparse
import hashlib
import random
import signal
import socket
import sys
import threading
import time

stop = threading.Event()


def value_for(tag, n):
    size = 16384 if n % 50 == 0 else 16 + (n * 7919) % 2033
    seed = hashlib.sha256(f"{tag}:{n}".encode()).digest()
    reps = size // len(seed) + 1
    return (seed * reps)[:size]


class Conn:
    def __init__(self, host, port):
        self.addr = (host, port)
        self.sock = None
        self.buf = b""

    def connect(self):
        self.close()
        self.sock = socket.create_connection(self.addr, timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def close(self):
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
        self.sock = None

    def send(self, *args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            if isinstance(a, str):
                a = a.encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.sock.sendall(b"".join(out))

    def _fill(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("connection closed by the server")
        self.buf += chunk

    def _line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return ("status", rest)
        if kind == b"-":
            return ("error", rest)
        if kind == b":":
            return ("int", int(rest))
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return ("nil", None)
            while len(self.buf) < n + 2:
                self._fill()
            data, self.buf = self.buf[:n], self.buf[n + 2:]
            return ("bulk", data)
        raise ValueError(f"unexpected reply line {line[:60]!r}")


class Checker(threading.Thread):
    def __init__(self, server, rate, tag):
        super().__init__(daemon=True)
        host, port = server.rsplit(":", 1)
        self.server = server
        self.conn = Conn(host, int(port))
        self.rate = rate
        self.tag = tag
        self.ops = 0
        self.checked = 0
        self.mismatches = 0
        self.errors = 0
        self.first_error = ""

    def fail(self, what, mismatch=False):
        if mismatch:
            self.mismatches += 1
        else:
            self.errors += 1
        if not self.first_error:
            self.first_error = f"{time.strftime('%H:%M:%S')} {what}"[:300]

    def expect(self, got, want, what):
        self.ops += 1
        if got != want:
            self.fail(f"{what}: expected {str(want)[:60]}, got {str(got)[:60]}", mismatch=True)
            return False
        return True

    def run(self):
        n = 0
        counter = None
        recent = []
        key = lambda i: f"soak:check:{self.tag}:{i}"
        ckey = f"soak:check:{self.tag}:counter"
        period = 1.0 / self.rate if self.rate > 0 else 0.0
        next_t = time.monotonic()
        connected = False
        while not stop.is_set():
            try:
                if not connected:
                    self.conn.connect()
                    self.conn.send("DEL", ckey)
                    self.conn.reply()
                    counter = 0
                    connected = True
                n += 1
                v = value_for(self.tag, n)
                self.conn.send("SET", key(n), v)
                self.expect(self.conn.reply(), ("status", b"OK"), f"SET {key(n)}")
                self.conn.send("GET", key(n))
                if self.expect(self.conn.reply(), ("bulk", v), f"GET {key(n)}"):
                    self.checked += 1
                recent.append(n)
                if len(recent) > 2000:
                    # Forget (and delete) the oldest: the key space stays bounded.
                    old = recent.pop(0)
                    self.conn.send("DEL", key(old))
                    self.expect(self.conn.reply(), ("int", 1), f"DEL {key(old)}")
                if n % 10 == 0:
                    m = random.choice(recent)
                    self.conn.send("GET", key(m))
                    if self.expect(self.conn.reply(), ("bulk", value_for(self.tag, m)), f"GET (older) {key(m)}"):
                        self.checked += 1
                    self.conn.send("INCR", ckey)
                    self.expect(self.conn.reply(), ("int", counter + 1), f"INCR {ckey}")
                    counter += 1
            except (OSError, ConnectionError, ValueError) as e:
                self.fail(f"{type(e).__name__}: {e}")
                connected = False
                self.conn.close()
                recent.clear()
                time.sleep(0.2)
            if period:
                next_t += period
                d = next_t - time.monotonic()
                if d > 0:
                    stop.wait(d)
                else:
                    next_t = time.monotonic()

    def summary(self):
        return (f"server={self.server} ops={self.ops} checked_values={self.checked} "
                f"mismatches={self.mismatches} errors={self.errors} "
                f"first_error={self.first_error.replace(' ', '_') or '-'}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=200.0, help="rounds per second per server")
    ap.add_argument("--out", required=True)
    ap.add_argument("servers", nargs="+", help="HOST:PORT")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    threads = [Checker(s, a.rate, f"{i}{random.randrange(1 << 30):x}") for i, s in enumerate(a.servers)]
    for t in threads:
        t.start()
    while not stop.is_set():
        stop.wait(1)
    for t in threads:
        t.join(timeout=15)
    with open(a.out, "w") as f:
        for t in threads:
            f.write(t.summary() + "\n")


if __name__ == "__main__":
    sys.exit(main())
