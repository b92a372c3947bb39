"""Encryption in transit for the tcp transport: TLS 1.3 (AES-GCM), bound to the cluster secret.

A target started with `encrypt` makes a throwaway self-signed certificate (P-256) and offers
TLS in its HELLO (auth byte bit 1). Nobody verifies that certificate against an authority:
instead both sides prove the secret over the TLS session, keyed to the certificate the client
actually saw, so a man in the middle (who must show its own certificate) can neither pass as
the target nor relay a client's proof:

    client -> target   HMAC(secret, "mck-tls-client" | nonce | SHA-256(certificate))
    target -> client   0 | HMAC(secret, "mck-tls-target" | nonce | SHA-256(certificate))

Encryption needs a secret (without one there is nothing to bind the session to).
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import os
import ssl
import tempfile

FLAG = 2  # HELLO auth byte: TLS follows
REPLY = 33  # status byte + the target's proof


def _certificate() -> tuple[bytes, bytes]:
    """(PEM key, PEM certificate) of a fresh self-signed P-256 certificate."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mooncake-transfer")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=365))
            .sign(key, hashes.SHA256()))
    return (key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()),
            cert.public_bytes(serialization.Encoding.PEM))


def server_context() -> tuple[ssl.SSLContext, bytes]:
    """A TLS 1.3 server context with a fresh certificate, and that certificate's SHA-256."""
    key, cert = _certificate()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    with tempfile.TemporaryDirectory(prefix="mooncake-tls-") as d:
        kpath, cpath = os.path.join(d, "key.pem"), os.path.join(d, "cert.pem")
        with open(os.open(kpath, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
            f.write(key)
        with open(cpath, "wb") as f:
            f.write(cert)
        ctx.load_cert_chain(cpath, kpath)
    return ctx, hashlib.sha256(ssl.PEM_cert_to_DER_cert(cert.decode())).digest()


def client_context() -> ssl.SSLContext:
    """TLS 1.3, the target's certificate taken as shown (the secret proofs bind it)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def seen_certificate(sock: ssl.SSLSocket) -> bytes:
    der = sock.getpeercert(binary_form=True)
    if not der:
        raise ssl.SSLError("the target showed no certificate")
    return hashlib.sha256(der).digest()


def client_proof(secret: str, nonce: bytes, cert_hash: bytes) -> bytes:
    return hmac.new(secret.encode(), b"mck-tls-client" + nonce + cert_hash,
                    hashlib.sha256).digest()


def target_proof(secret: str, nonce: bytes, cert_hash: bytes) -> bytes:
    return hmac.new(secret.encode(), b"mck-tls-target" + nonce + cert_hash,
                    hashlib.sha256).digest()
