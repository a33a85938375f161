"""Throwaway certificates and a TLS terminator, to test zapstream's Kafka clients over TLS.

Usage::

    pki = make_pki(tmp_dir)                       # CA, server cert for 127.0.0.1, client cert
    with TansuBroker(tls=pki.server) as broker:   # clients connect to broker.bootstrap with TLS
        ...  # ZAPSTREAM_KAFKA_SECURITY_PROTOCOL=SSL, ZAPSTREAM_KAFKA_SSL_CAFILE=pki.ca_file

Tansu 0.6.0 (the dev broker) accepts ``--cert``/``--key`` but serves plaintext
all the same (it does not even open the files), so :class:`TlsTerminator` does the
broker's side of TLS: it accepts TLS on its port, optionally requires a client
certificate signed by the CA (mutual TLS), and forwards the plaintext bytes to
the broker. The broker advertises the terminator's port, so every connection a
client makes after bootstrap is TLS too. The clients' side (certificate
verification, host name check, client certificate) is the real one.

Certificates come from the ``openssl`` command line (``cryptography`` is not a
dependency); keys are RSA 2048 and valid for two days.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
import ssl
import subprocess
import threading
from pathlib import Path

from devtools.stack.lifecycle import StartStop

__all__ = ["Pki", "ServerTls", "TlsTerminator", "make_pki"]

_BUFFER = 64 * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class ServerTls:
    """What a TLS listener needs: its certificate and key, and the CA its clients' certificates
    must be signed by (None: no client certificate asked for)."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Pki:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate."""

    ca_file: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca_file: Path
    """A second CA that signed nothing here: trusting it alone must fail verification."""

    @property
    def server(self) -> ServerTls:
        return ServerTls(self.server_cert, self.server_key)

    @property
    def server_mutual(self) -> ServerTls:
        """The server side of mutual TLS: clients must show a certificate signed by the CA."""
        return ServerTls(self.server_cert, self.server_key, self.ca_file)


def _openssl(*args: str, cwd: Path) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        raise RuntimeError(
            "the openssl command is needed for test certificates: apt-get install openssl"
        )
    proc = subprocess.run(
        [binary, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {proc.stderr.strip()}")


def _ca(directory: Path, name: str) -> tuple[Path, Path]:
    key, cert = directory / f"{name}.key", directory / f"{name}.pem"
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-subj", f"/CN={name}", "-keyout", key.name, "-out", cert.name,
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip
    return cert, key


def _leaf(directory: Path, name: str, ca: tuple[Path, Path], extensions: str) -> tuple[Path, Path]:
    key, csr, cert = directory / f"{name}.key", directory / f"{name}.csr", directory / f"{name}.pem"
    ext = directory / f"{name}.ext"
    ext.write_text(extensions)
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
        "-keyout", key.name, "-out", csr.name,
        cwd=directory,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", csr.name, "-CA", ca[0].name, "-CAkey", ca[1].name,
        "-CAcreateserial", "-days", "2", "-extfile", ext.name, "-out", cert.name,
        cwd=directory,
    )  # fmt: skip
    return cert, key


def make_pki(directory: Path) -> Pki:
    """Generate a throwaway CA and the certificates it signs into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = _ca(directory, "test-ca")
    other = _ca(directory, "other-ca")
    server = _leaf(
        directory,
        "broker",
        ca,
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    client = _leaf(directory, "zapstream-client", ca, "extendedKeyUsage=clientAuth\n")
    return Pki(ca[0], server[0], server[1], client[0], client[1], other[0])


class TlsTerminator(StartStop):
    """Accepts TLS on ``127.0.0.1:port`` and forwards the plaintext to ``127.0.0.1:target_port``.

    An asyncio loop in a thread of its own (the callers are synchronous tests), one
    pair of tasks per connection: an ``ssl.SSLSocket`` must not be read and written
    from two threads at once, so the thread-based :class:`devtools.simulator.tcp_proxy.TcpProxy`
    cannot simply wrap its sockets.
    """

    def __init__(self, target_port: int, tls: ServerTls, *, port: int = 0) -> None:
        self.target_port = target_port
        self.tls = tls
        self._port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        if not self._port:
            raise RuntimeError("TlsTerminator is not started")
        return self._port

    def _context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.tls.cert_file, self.tls.key_file)
        if self.tls.client_ca_file is not None:
            context.load_verify_locations(self.tls.client_ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def start(self) -> None:
        if self._loop is not None:
            raise RuntimeError("TlsTerminator is already started")
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="tls-terminator", daemon=True)
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._listen(), loop)
        try:
            future.result(timeout=10)
        except BaseException:
            self.stop()
            raise

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(
            self._serve,
            "127.0.0.1",
            self._port,
            ssl=self._context(),
            ssl_handshake_timeout=10,
        )
        self._port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(
            self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True
        )

    @staticmethod
    async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while chunk := await src.read(_BUFFER):
                dst.write(chunk)
                await dst.drain()
        finally:
            dst.close()
            with contextlib.suppress(OSError, ssl.SSLError):
                await dst.wait_closed()

    def stop(self) -> None:
        """Close the listener and every connection; idempotent."""
        loop, self._loop = self._loop, None
        if loop is None:
            return

        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        loop.close()
        self._server = None
        self._thread = None
