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
