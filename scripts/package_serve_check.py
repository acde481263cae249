#!/usr/bin/env python3
"""Starts a packaged `lanes serve` the way lanes.service does (Type=notify) and checks it.

Usage: package_serve_check.py CONFIG COMMAND...

COMMAND is the packaged binary, possibly behind a wrapper that execs it in the same process
(setpriv, to run with the unit's capability bounding set and no_new_privs).

The binary runs with NOTIFY_SOCKET set to an abstract unix datagram socket this script binds
(systemd passes such '@' names too). Checks, each against a deadline and never by sleeping:
the banner reaches stdout and names a loopback portal; READY=1 arrives on the socket; the
portal accepts a TCP connection; SIGHUP (what `systemctl reload` sends) leaves it running;
SIGTERM brings STOPPING=1 and a clean exit (status 0). Prints one line per check.
"""

import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import time

DEADLINE = 60.0


def fail(message, output=""):
    print(f"package-check: FAIL: {message}", file=sys.stderr)
    if output:
        print(output, file=sys.stderr)
    sys.exit(1)


def read_some(stream):
    """What the pipe holds now (b"" at EOF or when empty), read from its descriptor."""
    try:
        return os.read(stream.fileno(), 65536)
    except BlockingIOError:
        return b""


def main():
    config, command = sys.argv[1], sys.argv[2:]
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"lanes-package-check-{os.getpid()}"
    notify.bind("\0" + name)
    notify.setblocking(False)
    env = dict(os.environ, NOTIFY_SOCKET="@" + name, RUST_LOG="info")
    child = subprocess.Popen(
        [*command, "serve", "--config", config],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    os.set_blocking(child.stdout.fileno(), False)
    os.set_blocking(child.stderr.fileno(), False)
    selector = selectors.DefaultSelector()
    selector.register(child.stdout, selectors.EVENT_READ, "stdout")
    selector.register(child.stderr, selectors.EVENT_READ, "stderr")
    selector.register(notify, selectors.EVENT_READ, "notify")
    seen = {"stdout": b"", "stderr": b"", "notify": []}

    def pump(until, what):
        """Reads stdout, stderr and datagrams until until() holds or the deadline passes."""
        end = time.monotonic() + DEADLINE
        while not until():
            left = end - time.monotonic()
            if left <= 0:
                child.kill()
                fail(f"no {what} within {DEADLINE:.0f} s", logs())
            for key, _ in selector.select(timeout=min(left, 1.0)):
                if key.data == "notify":
                    seen["notify"].append(notify.recv(4096).decode())
                else:
                    seen[key.data] += read_some(key.fileobj)
            if child.poll() is not None and not until():
                # Drain what is left, then give up: the process is gone.
                for stream in ("stdout", "stderr"):
                    seen[stream] += read_some(getattr(child, stream))
                while True:
                    try:
                        seen["notify"].append(notify.recv(4096).decode())
                    except BlockingIOError:
                        break
                if not until():
                    fail(f"lanes serve exited ({child.returncode}) before {what}", logs())

    def logs():
        return (
            "--- stdout\n" + seen["stdout"].decode(errors="replace")
            + "--- stderr\n" + seen["stderr"].decode(errors="replace")
            + "--- notify\n" + repr(seen["notify"])
        )

    def states():
        return [line for message in seen["notify"] for line in message.split("\n")]

    banner = re.compile(rb"portal\s+(127\.0\.0\.1:\d+)\s+TPGT \d+")
    pump(lambda: b"Status:" in seen["stdout"] and banner.search(seen["stdout"]), "banner")
    portal = banner.search(seen["stdout"]).group(1).decode()
    print(f"package-check: banner names portal {portal}")
    pump(lambda: "READY=1" in states(), "READY=1 on NOTIFY_SOCKET")
    print(f"package-check: NOTIFY_SOCKET received {seen['notify'][0]!r}")

    host, port = portal.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=DEADLINE):
        pass
    print(f"package-check: portal {portal} accepts TCP connections")

    child.send_signal(signal.SIGHUP)
    pump(lambda: b"SIGHUP" in seen["stderr"], "log line for SIGHUP")
    if child.poll() is not None:
        fail(f"SIGHUP ended lanes serve ({child.returncode})", logs())
    with socket.create_connection((host, int(port)), timeout=DEADLINE):
        pass
    print("package-check: SIGHUP logged and ignored, portal still accepts")

    child.send_signal(signal.SIGTERM)
    pump(lambda: "STOPPING=1" in states(), "STOPPING=1 after SIGTERM")
    try:
        code = child.wait(timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        child.kill()
        fail("lanes serve did not exit within the deadline after SIGTERM", logs())
    if code != 0:
        fail(f"lanes serve exited with status {code} after SIGTERM", logs())
    print("package-check: SIGTERM -> STOPPING=1, exit status 0")


if __name__ == "__main__":
    main()
