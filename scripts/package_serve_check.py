#!/usr/bin/env python3
"""Runs the packaged binary the way lanes.service and lanes-attach@.service do (Type=notify).

Usage: package_serve_check.py WORK_DIR CONFIG SERVE_COMMAND ATTACH_COMMAND [SERVE_FILTER]

SERVE_COMMAND and ATTACH_COMMAND are shell-quoted command lines ending in the packaged binary,
possibly behind a wrapper that execs it in the same process (setpriv, to run with a unit's
capability bounding set and no_new_privs). SERVE_FILTER is lanes.service's SystemCallFilter=
value: lanes serve then runs under the same seccomp filter (other system calls fail with EPERM,
as with the unit's SystemCallErrorNumber=EPERM).

Each process gets NOTIFY_SOCKET, an abstract unix datagram socket this script binds (systemd
passes such '@' names too). Checks, each against a deadline and never by sleeping:
`lanes serve --config CONFIG` prints its banner naming a loopback portal and sends READY=1; the
portal accepts a TCP connection; SIGHUP (what `systemctl reload` sends) reloads the config and leaves it running;
`lanes attach` of its LUN 0 with NBD and FUSE exports sends READY=1, the NBD socket greets,
the FUSE file reads (where /dev/fuse exists), and SIGTERM brings STOPPING=1 and exit 0; then SIGTERM to the target brings STOPPING=1 and exit 0.
Prints one line per check.
"""

import os
import re
import selectors
import shlex
import signal
import socket
import subprocess
import sys
import time

DEADLINE = 60.0


# Every child started, killed when a check fails (the shell script then unmounts and cleans up).
CHILDREN = []


def fail(message, output=""):
    print(f"package-check: FAIL: {message}", file=sys.stderr)
    if output:
        print(output, file=sys.stderr)
    for child in CHILDREN:
        if child.poll() is None:
            child.kill()
            child.wait()
    sys.exit(1)


def read_some(stream):
    """What the pipe holds now (b"" at EOF or when empty), read from its descriptor."""
    try:
        return os.read(stream.fileno(), 65536)
    except BlockingIOError:
        return b""


def syscall_names(groups):
    """The system calls systemd's SystemCallFilter= allows for these names and @groups."""
    names, pending, expanded = set(), list(groups), set()
    while pending:
        item = pending.pop()
        if not item.startswith("@"):
            names.add(item)
            continue
        if item in expanded:
            continue
        expanded.add(item)
        listing = subprocess.run(
            ["systemd-analyze", "syscall-filter", item],
            check=True, capture_output=True, text=True,
        ).stdout
        for line in listing.splitlines()[1:]:
            word = line.strip()
            if word and not word.startswith("#"):
                pending.append(word)
    return names


def syscall_filter(groups):
    """A preexec function that loads a seccomp filter like the unit's SystemCallFilter= with
    SystemCallErrorNumber=EPERM: the listed system calls run, every other one fails with
    EPERM (libseccomp through ctypes)."""
    import ctypes
    import errno

    allowed = sorted(syscall_names(groups))
    seccomp = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    seccomp.seccomp_init.restype = ctypes.c_void_p
    seccomp.seccomp_init.argtypes = [ctypes.c_uint32]
    seccomp.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    seccomp.seccomp_rule_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                         ctypes.c_uint]
    seccomp.seccomp_load.argtypes = [ctypes.c_void_p]
    numbers = [seccomp.seccomp_syscall_resolve_name(n.encode()) for n in allowed]
    numbers = [n for n in numbers if n >= 0]  # names of other architectures resolve < 0
    act_allow, act_eperm = 0x7FFF0000, 0x00050000 | errno.EPERM

    def load():
        context = seccomp.seccomp_init(act_eperm)
        for number in numbers:
            if seccomp.seccomp_rule_add(context, act_allow, number, 0) != 0:
                os._exit(126)
        if seccomp.seccomp_load(context) != 0:
            os._exit(126)

    return load, len(numbers)


class Watched:
    """A child process with its stdout, stderr and service-manager datagrams collected."""

    def __init__(self, name, command, env=None, preexec=None):
        self.name = name
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        address = f"lanes-package-check-{os.getpid()}-{name}"
        self.notify.bind("\0" + address)
        self.notify.setblocking(False)
        environment = dict(os.environ, NOTIFY_SOCKET="@" + address, RUST_LOG="info")
        environment.update(env or {})
        self.child = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=environment,
            preexec_fn=preexec,
        )
        CHILDREN.append(self.child)
        os.set_blocking(self.child.stdout.fileno(), False)
        os.set_blocking(self.child.stderr.fileno(), False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.child.stdout, selectors.EVENT_READ, "stdout")
        self.selector.register(self.child.stderr, selectors.EVENT_READ, "stderr")
        self.selector.register(self.notify, selectors.EVENT_READ, "notify")
        self.seen = {"stdout": b"", "stderr": b"", "notify": []}

    def drain(self):
        for stream in ("stdout", "stderr"):
            self.seen[stream] += read_some(getattr(self.child, stream))
        while True:
            try:
                self.seen["notify"].append(self.notify.recv(4096).decode())
            except BlockingIOError:
                break

    def pump(self, until, what):
        """Collects output until until() holds; fails at the deadline or if the child exits."""
        end = time.monotonic() + DEADLINE
        while not until():
            left = end - time.monotonic()
            if left <= 0:
                self.child.kill()
                fail(f"{self.name}: no {what} within {DEADLINE:.0f} s", self.logs())
            for key, _ in self.selector.select(timeout=min(left, 1.0)):
                if key.data == "notify":
                    self.seen["notify"].append(self.notify.recv(4096).decode())
                else:
                    self.seen[key.data] += read_some(key.fileobj)
            if self.child.poll() is not None and not until():
                self.drain()
                if not until():
                    fail(
                        f"{self.name} exited ({self.child.returncode}) before {what}",
                        self.logs(),
                    )

    def states(self):
        return [line for message in self.seen["notify"] for line in message.split("\n")]

    def logs(self):
        return (
            f"--- {self.name} stdout\n" + self.seen["stdout"].decode(errors="replace")
            + f"--- {self.name} stderr\n" + self.seen["stderr"].decode(errors="replace")
            + f"--- {self.name} notify\n" + repr(self.seen["notify"])
        )

    def stop(self):
        """SIGTERM: STOPPING=1 must arrive and the process must exit 0."""
        self.child.send_signal(signal.SIGTERM)
        self.pump(lambda: "STOPPING=1" in self.states(), "STOPPING=1 after SIGTERM")
        try:
            code = self.child.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            self.child.kill()
            fail(f"{self.name} did not exit within the deadline after SIGTERM", self.logs())
        if code != 0:
            self.drain()
            fail(f"{self.name} exited with status {code} after SIGTERM", self.logs())
        print(f"package-check: {self.name}: SIGTERM -> STOPPING=1, exit status 0")


def connect(host, port):
    with socket.create_connection((host, int(port)), timeout=DEADLINE):
        pass


# What the attach check writes through the FUSE file, and where (the LUN's 1 MiB mark).
WRITTEN = bytes((i * 7 + 3) % 251 for i in range(64 << 10))
WRITTEN_AT = 1 << 20


def main():
    work, config = sys.argv[1], sys.argv[2]
    backing = os.path.join(work, "var-lib-lanes", "disk0.img")
    serve_command, attach_command = shlex.split(sys.argv[3]), shlex.split(sys.argv[4])
    # The serve unit's SystemCallFilter= value, when given.
    serve_filter = sys.argv[5].split() if len(sys.argv) > 5 and sys.argv[5] else []

    preexec = None
    if serve_filter:
        preexec, count = syscall_filter(serve_filter)
        print(f"package-check: lanes serve runs under SystemCallFilter={' '.join(serve_filter)} "
              f"({count} system calls, every other one EPERM)")
    serve = Watched("lanes serve", [*serve_command, "serve", "--config", config],
                    preexec=preexec)
    portal_line = re.compile(rb"portal\s+(127\.0\.0\.1:\d+)\s+TPGT \d+")
    target_line = re.compile(rb"^Target (\S+)$", re.MULTILINE)
    serve.pump(
        lambda: b"Status:" in serve.seen["stdout"]
        and portal_line.search(serve.seen["stdout"])
        and target_line.search(serve.seen["stdout"]),
        "banner",
    )
    portal = portal_line.search(serve.seen["stdout"]).group(1).decode()
    target = target_line.search(serve.seen["stdout"]).group(1).decode()
    print(f"package-check: lanes serve: banner names {target} on portal {portal}")
    serve.pump(lambda: "READY=1" in serve.states(), "READY=1 on NOTIFY_SOCKET")
    print(f"package-check: lanes serve: NOTIFY_SOCKET received {serve.seen['notify'][0]!r}")
    host, port = portal.rsplit(":", 1)
    connect(host, port)
    print(f"package-check: lanes serve: portal {portal} accepts TCP connections")

    serve.child.send_signal(signal.SIGHUP)
    serve.pump(lambda: b"SIGHUP" in serve.seen["stderr"], "log line for SIGHUP")
    if serve.child.poll() is not None:
        fail(f"SIGHUP ended lanes serve ({serve.child.returncode})", serve.logs())
    connect(host, port)
    print("package-check: lanes serve: SIGHUP reloads the packaged config, portal still accepts")

    mount = os.path.join(work, "fuse")
    nbd = os.path.join(work, "nbd.sock")
    os.makedirs(mount, exist_ok=True)
    # FUSE needs /dev/fuse; without it the check exports NBD only.
    fuse = os.path.exists("/dev/fuse")
    if not fuse:
        raise SystemExit("package-check: no /dev/fuse: the attach unit's FUSE export cannot be checked")
    attach = Watched(
        "lanes attach",
        [
            *attach_command,
            "attach",
            f"iscsi://{portal}/{target}/0",
            *(["--fuse", mount] if fuse else []),
            "--nbd",
            "unix:" + nbd,
            "--status-socket",
            os.path.join(work, "attach.sock"),
        ],
        env={"LANES_RUN_DIR": os.path.join(work, "run")},
    )
    attach.pump(lambda: "READY=1" in attach.states(), "READY=1 on NOTIFY_SOCKET")
    print(f"package-check: lanes attach: NOTIFY_SOCKET received {attach.seen['notify'][0]!r}")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(DEADLINE)
        client.connect(nbd)
        # NBD newstyle handshake: the server speaks first with NBDMAGIC.
        if client.recv(8) != b"NBDMAGIC":
            fail(f"the NBD export {nbd} does not greet with NBDMAGIC", attach.logs())
    print(f"package-check: lanes attach: NBD export {nbd} answers")
    disk = os.path.join(mount, "disk")
    if fuse:
        # A write, flushed (SYNCHRONIZE CACHE on the target), read back: the target's write
        # path runs under the unit's system call filter too.
        with open(disk, "r+b", buffering=0) as exported:
            size = exported.seek(0, os.SEEK_END)
            exported.seek(WRITTEN_AT)
            exported.write(WRITTEN)
            os.fsync(exported.fileno())
            exported.seek(WRITTEN_AT)
            back = exported.read(len(WRITTEN))
        if size != 1 << 30 or back != WRITTEN:
            fail(f"the FUSE file {disk} is {size} bytes, wrote and read back "
                 f"{len(back)} bytes that {'differ' if back != WRITTEN else 'match'}",
                 attach.logs())
        print(f"package-check: lanes attach: FUSE file {disk} is 1 GiB; 64 KiB written, "
              "flushed and read back")
    else:
        print("package-check: lanes attach: no /dev/fuse here, FUSE export not checked")
    attach.stop()
    if os.path.exists(disk):
        fail(f"{disk} is still mounted after lanes attach stopped", attach.logs())

    serve.stop()
    if fuse:
        with open(backing, "rb") as lun:
            lun.seek(WRITTEN_AT)
            if lun.read(len(WRITTEN)) != WRITTEN:
                fail(f"the write through the FUSE file is not in {backing}")
        print(f"package-check: the write is in the backing file {backing}")


if __name__ == "__main__":
    main()
