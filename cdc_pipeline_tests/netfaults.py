"""Real network faults for tests: a TCP proxy in front of a real server that can be cut and restored."""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpProxy:
    """Forwards 127.0.0.1:<port> to a real server. stop() cuts every connection and refuses new ones,
    as a broker going down would; start() brings it back on the same port."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.port = 0
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._acceptor: threading.Thread | None = None

    def start(self) -> TcpProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        listener.settimeout(0.1)  # so the accept loop notices stop()
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._stop = threading.Event()
        self._acceptor = threading.Thread(target=self._accept, args=(listener, self._stop), daemon=True)
        self._acceptor.start()
        return self

    def _accept(self, listener: socket.socket, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except (TimeoutError, OSError):
                continue
            if stop.is_set():  # accepted while stop() cut the others: it must not outlive them
                client.close()
                continue
            client.settimeout(None)
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                if stop.is_set():
                    client.close()
                    upstream.close()
                    continue
                self._sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()
        listener.close()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            for s in self._sockets:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self._sockets = []
        # The accept loop closes the listener as it ends (within its 0.1 s accept timeout): waited for, so
        # the port refuses from here on and a start() can bind it again; no fixed 0.3 s per stop.
        acceptor, self._acceptor = self._acceptor, None
        if acceptor is not None:
            acceptor.join(60)
            assert not acceptor.is_alive(), "the proxy's accept loop did not end"
