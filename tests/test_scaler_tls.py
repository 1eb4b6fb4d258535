"""TLS and mutual TLS, as a KEDA TriggerAuthentication with caCert, tlsClientCert and
tlsClientKey uses them."""

from __future__ import annotations

import grpc
import pytest
import trustme

from protos.externalscaler import externalscaler_pb2_grpc as keda_grpc
from scaler.config import ScalerConfig
from scaler.server import ScalerServer, TlsFiles
from tests.conftest import ref

HOST = "unitscale-scaler.keda.svc"


@pytest.fixture(scope="module")
def ca():
    return trustme.CA()


@pytest.fixture(scope="module")
def server_cert(ca):
    return ca.issue_cert(HOST, "127.0.0.1")


def write_tls(tmp_path, ca, server_cert, mutual):
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    server_cert.cert_chain_pems[0].write_to_path(str(cert))
    server_cert.private_key_pem.write_to_path(str(key))
    client_ca = None
    if mutual:
        client_ca = tmp_path / "client-ca.crt"
        ca.cert_pem.write_to_path(str(client_ca))
    return TlsFiles(cert, key, client_ca)


async def spec_over(port, credentials):
    options = [("grpc.ssl_target_name_override", HOST)]
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials, options) as chan:
        return await keda_grpc.ExternalScalerStub(chan).GetMetricSpec(ref(), timeout=5)


@pytest.mark.parametrize("mutual", [False, True], ids=["server-tls", "mutual-tls"])
async def test_a_client_trusting_the_ca_gets_answers(tmp_path, ca, server_cert, mutual):
    server = ScalerServer(
        ScalerConfig(), "127.0.0.1:0", write_tls(tmp_path, ca, server_cert, mutual)
    )
    port = await server.start()
    try:
        client = ca.issue_cert("keda-operator.keda.svc")
        credentials = grpc.ssl_channel_credentials(
            root_certificates=ca.cert_pem.bytes(),
            private_key=client.private_key_pem.bytes() if mutual else None,
            certificate_chain=client.cert_chain_pems[0].bytes() if mutual else None,
        )
        spec = await spec_over(port, credentials)
        assert spec.metricSpecs[0].metricName == "unitscale-desired-replicas"
    finally:
        await server.stop(grace=0)


@pytest.mark.parametrize(
    "client",
    [
        pytest.param("no-client-cert", id="mutual-tls-refuses-a-client-without-a-certificate"),
        pytest.param("foreign-client-cert", id="mutual-tls-refuses-a-certificate-from-another-ca"),
        pytest.param("plaintext", id="tls-refuses-plaintext"),
    ],
)
async def test_untrusted_clients_are_refused(tmp_path, ca, server_cert, client):
    server = ScalerServer(ScalerConfig(), "127.0.0.1:0", write_tls(tmp_path, ca, server_cert, True))
    port = await server.start()
    try:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            if client == "plaintext":
                async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as chan:
                    await keda_grpc.ExternalScalerStub(chan).GetMetricSpec(ref(), timeout=3)
            else:
                other = trustme.CA().issue_cert("intruder")
                credentials = grpc.ssl_channel_credentials(
                    root_certificates=ca.cert_pem.bytes(),
                    private_key=other.private_key_pem.bytes()
                    if client != "no-client-cert"
                    else None,
                    certificate_chain=(
                        other.cert_chain_pems[0].bytes() if client != "no-client-cert" else None
                    ),
                )
                await spec_over(port, credentials)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop(grace=0)


def test_unreadable_tls_files_name_the_file(tmp_path):
    from foundation.errors import ConfigError

    with pytest.raises(ConfigError, match=r"missing\.crt"):
        TlsFiles(tmp_path / "missing.crt", tmp_path / "missing.key").credentials()


def _write(tmp_path, name, pem):
    path = tmp_path / name
    path.write_bytes(pem)
    return path


@pytest.mark.parametrize(
    ("files", "named"),
    [
        pytest.param(
            {"cert": "server", "key": "other"}, ["tls.crt", "tls.key", "do not match"],
            id="a-key-from-another-certificate-names-both-files",
        ),
        pytest.param(
            {"cert": "garbage", "key": "server"}, ["tls.crt", "tls.key"],
            id="a-certificate-that-is-no-pem-names-both-files",
        ),
        pytest.param(
            {"cert": "server", "key": "garbage"}, ["tls.crt", "tls.key"],
            id="a-key-that-is-no-pem-names-both-files",
        ),
        pytest.param(
            {"cert": "key-as-cert", "key": "cert-as-key"}, ["tls.crt", "tls.key"],
            id="certificate-and-key-swapped-name-both-files",
        ),
        pytest.param(
            {"cert": "server", "key": "server", "ca": "garbage"}, ["client-ca.crt"],
            id="a-client-ca-that-is-no-certificate-names-its-file",
        ),
    ],
)  # fmt: skip
def test_an_unusable_certificate_or_key_is_a_config_error_naming_the_files(
    tmp_path, ca, server_cert, files, named
):
    from foundation.errors import ConfigError

    pems = {
        "server": (server_cert.cert_chain_pems[0].bytes(), server_cert.private_key_pem.bytes()),
        "other": (b"", trustme.CA().issue_cert("other").private_key_pem.bytes()),
        "garbage": (b"not a certificate\n", b"not a key\n"),
        "key-as-cert": (server_cert.private_key_pem.bytes(), b""),
        "cert-as-key": (b"", server_cert.cert_chain_pems[0].bytes()),
    }
    cert = _write(tmp_path, "tls.crt", pems[files["cert"]][0])
    key = _write(tmp_path, "tls.key", pems[files["key"]][1])
    client_ca = _write(tmp_path, "client-ca.crt", b"not a CA\n") if "ca" in files else None
    with pytest.raises(ConfigError) as caught:
        ScalerServer(ScalerConfig(), "127.0.0.1:0", TlsFiles(cert, key, client_ca))
    for fragment in named:
        assert fragment in str(caught.value)


def test_an_encrypted_key_is_a_config_error_not_a_password_prompt(tmp_path, server_cert):
    from cryptography.hazmat.primitives import serialization

    from foundation.errors import ConfigError

    private = serialization.load_pem_private_key(server_cert.private_key_pem.bytes(), None)
    encrypted = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    )
    cert = _write(tmp_path, "tls.crt", server_cert.cert_chain_pems[0].bytes())
    key = _write(tmp_path, "tls.key", encrypted)
    with pytest.raises(ConfigError, match=r"tls\.key"):
        TlsFiles(cert, key).credentials()
