"""Listeners: the TLS context and TCP site, the Unix-socket site, and the dev certificates.

Owns: building the server TLS context, safely preparing a Unix-socket path (a stale socket
file is removed; a live one, or anything that is not a socket, is never touched), setting
the socket's mode, and generating a self-signed dev CA plus a server certificate for
127.0.0.1 / ::1 / localhost.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import socket
import ssl
import stat
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gateway import secretfile


class ListenerError(RuntimeError):
    pass


def server_tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as exc:
        raise ListenerError(f"cannot load TLS certificate {cert} / key {key}: {type(exc).__name__}") from None
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def prepare_socket_path(path: Path) -> None:
    """Make `path` bindable: create its directory; remove a stale socket; refuse otherwise."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ListenerError(f"{path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(0.5)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        path.unlink(missing_ok=True)  # stale: nobody is listening
        return
    except OSError as exc:
        raise ListenerError(f"{path}: cannot tell whether the socket is in use ({exc.strerror})") from None
    finally:
        probe.close()
    raise ListenerError(f"{path}: another process is already listening on this socket")


def socket_umask(mode: int) -> int:
    """The umask that makes a newly bound socket no more permissive than `mode`."""
    return 0o777 & ~mode


def set_socket_mode(path: Path, mode: int) -> None:
    """Give the socket just bound at `path` the mode `mode`, never following a link.

    Bound under `socket_umask(mode)`, it normally has that mode already. What is at `path`
    now is looked at without following a symlink (someone who can write the directory may
    have swapped the socket for a link to a file between the bind and this call) and must be
    a socket, else it refuses. On Linux it is opened as an O_PATH descriptor and that inode's
    mode is changed; elsewhere (macOS, the BSDs) the path is changed without following a link
    where the platform can."""
    o_path = getattr(os, "O_PATH", None)
    fd = None
    try:
        if o_path is not None:
            fd = os.open(path, o_path | os.O_NOFOLLOW | os.O_CLOEXEC)
        st = os.lstat(path) if fd is None else os.fstat(fd)
    except OSError as exc:
        if fd is not None:
            os.close(fd)
        raise ListenerError(f"{path}: the socket just bound cannot be opened ({exc.strerror})") from None
    try:
        if not stat.S_ISSOCK(st.st_mode):
            raise ListenerError(f"{path} is no longer the socket just bound; refusing to change its mode")
        if stat.S_IMODE(st.st_mode) == mode:
            return
        if fd is not None:
            os.chmod(f"/proc/self/fd/{fd}", mode)  # the inode the descriptor holds, not a path lookup
        else:
            os.chmod(path, mode, follow_symlinks=os.chmod not in os.supports_follow_symlinks)
    finally:
        if fd is not None:
            os.close(fd)


# --- dev certificates ----------------------------------------------------------------


def _name(common: str) -> x509.Name:
    return x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "wiregate dev"), x509.NameAttribute(NameOID.COMMON_NAME, common)]
    )


def _write_private(path: Path, data: bytes) -> None:
    secretfile.write_private(path, data)


def generate_dev_tls(directory: Path, *, days: int = 825) -> tuple[Path, Path, Path]:
    """A dev CA and a server certificate signed by it. Returns (ca.pem, server.pem, server.key).

    Whoever trusts the dev CA trusts what it signs, so the CA is name-constrained to the
    loopback names (localhost, 127.0.0.0/8, ::1) and its private key is discarded once the
    server certificate is issued: it never touches disk. A new certificate is a new CA
    (`wiregate init --force`)."""
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("wiregate dev CA"))
        .issuer_name(_name("wiregate dev CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(
            x509.NameConstraints(
                permitted_subtrees=[
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_network("127.0.0.0/8")),
                    x509.IPAddress(ipaddress.ip_network("::1/128")),
                ],
                excluded_subtrees=None,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    san = x509.SubjectAlternativeName(
        [
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("::1")),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("localhost"))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(san, critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, True, False, False, False, False, False, False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    ca_path, cert_path, key_path = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    ca_path.write_bytes(ca_cert.public_bytes(pem))
    del ca_key  # never written: nothing else can ever be signed by this CA
    cert_path.write_bytes(cert.public_bytes(pem))
    _write_private(key_path, key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return ca_path, cert_path, key_path
