"""The launcher every sandboxed command starts through: limits, the uid drop, the relay, then exec.

Stdlib only and no slimecli import: it runs as `python3 -I -S inner.py [FLAG VALUE]... -- ARGV` with the base
interpreter, inside the sandbox. It starts every sandboxed command, so it imports next to nothing: the spec is
plain arguments (json's import alone cost more than the rest of the start-up), the relay's modules load only
where a relay runs. Limits are set here, after the namespaces exist, because RLIMIT_NPROC is counted per
(user namespace, uid): set inside, it bounds this sandbox alone. The relay is one thread with a selector
(threads count as processes too). The host side of the relay (relay.py) reuses `Relay`.
"""

import os
import resource
import sys

CHUNK = 1 << 16


class Relay:
    """Accept on each listener, connect upstream with `connect(target)`, copy both ways until either side ends."""

    def __init__(self, listeners, connect, stop_fd=None):
        import selectors  # here, not at the top: most commands have no relay

        self.sel = selectors.DefaultSelector()
        self.readable = selectors.EVENT_READ
        self.peers = {}
        self.connect = connect
        self.stop_fd = stop_fd
        for server, target in listeners:
            server.setblocking(False)
            self.sel.register(server, self.readable, target)
        if stop_fd is not None:
            self.sel.register(stop_fd, self.readable, None)

    def run(self):
        while True:
            for key, _ in self.sel.select():
                if key.fileobj == self.stop_fd:
                    self.close_all()
                    return
                if key.data is not None:
                    self.accept(key.fileobj, key.data)
                else:
                    self.copy(key.fileobj)

    def accept(self, server, target):
        try:
            client, _ = server.accept()
        except (BlockingIOError, InterruptedError):
            return
        try:
            upstream = self.connect(target)
        except OSError:
            client.close()  # the peer is down: the client sees a closed connection, as without a relay
            return
        for a, b in ((client, upstream), (upstream, client)):
            a.setblocking(False)
            self.peers[a] = b
            self.sel.register(a, self.readable, None)

    def copy(self, src):
        dst = self.peers.get(src)
        if dst is None:
            return
        try:
            data = src.recv(CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data:
            try:
                dst.setblocking(True)  # back-pressure: a slow reader slows the writer, nothing is buffered here
                dst.sendall(data)
                dst.setblocking(False)
                return
            except OSError:
                data = b""
        self.drop(src)

    def drop(self, sock):
        for s in (sock, self.peers.get(sock)):
            if s is not None and s in self.peers:
                self.sel.unregister(s)
                del self.peers[s]
                s.close()

    def close_all(self):
        import socket

        for s in list(self.peers):
            self.drop(s)
        for key in list(self.sel.get_map().values()):
            self.sel.unregister(key.fileobj)
            if isinstance(key.fileobj, socket.socket):
                key.fileobj.close()


def _unix(path):
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError:
        s.close()
        raise
    return s


def parse(args):
    """(spec, argv) from `[FLAG VALUE]... -- ARGV`: --limit NAME=N, --drop UID, --relay PORT=PATH (repeatable),
    --cgroup PROCS (the cgroup.procs file of a cgroup to join), --cwd DIR, --env NAME=VALUE (repeatable: the
    whole environment)."""
    spec = {"limit": [], "relay": [], "env": [], "drop": None, "cgroup": None, "cwd": "/"}
    end = args.index("--")
    for i in range(0, end, 2):
        flag, value = args[i][2:], args[i + 1]
        if isinstance(spec[flag], list):
            spec[flag].append(value)
        else:
            spec[flag] = value
    return spec, args[end + 1:]


def main():
    spec, argv = parse(sys.argv[1:])
    if spec["cgroup"] is not None:  # before anything forks: every process of the command is counted in it
        try:
            with open(spec["cgroup"], "w") as procs:
                procs.write(str(os.getpid()))
        except OSError as exc:  # never run without the limit the sandbox promised
            sys.stderr.write(f"sandbox: cannot join the process-limit cgroup: {exc.strerror}\n")
            os._exit(126)
    for item in spec["limit"]:
        name, value = item.split("=", 1)
        resource.setrlimit(getattr(resource, "RLIMIT_" + name.upper()), (int(value), int(value)))
    if spec["drop"] is not None:  # root inside a namespace made for us: become the sandbox uid for good
        drop = int(spec["drop"])
        os.setgroups([])
        os.setresgid(drop, drop, drop)
        os.setresuid(drop, drop, drop)
    listeners = []
    for item in spec["relay"]:
        import socket

        port, path = item.split("=", 1)
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.bind(("127.0.0.1", int(port)))
        server.listen(64)
        listeners.append((server, path))
    if listeners and os.fork() == 0:  # listening before the command starts: no connect-before-ready race
        os.setsid()
        try:
            Relay(listeners, _unix).run()
        finally:
            os._exit(0)
    for server, _ in listeners:
        server.close()
    os.chdir(spec["cwd"])
    env = dict(item.split("=", 1) for item in spec["env"])
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        sys.stderr.write(f"sandbox: cannot run {argv[0]}: {exc.strerror}\n")
        os._exit(127 if isinstance(exc, FileNotFoundError) else 126)


if __name__ == "__main__":
    main()
