# syntax=docker/dockerfile:1
# unitscale's one image: `unitscale <subcommand>` (scaler, exporter, gateway, admission, ...).
#   docker build -t unitscale:0.1.0 .     (docs/operations.md#the-image)
# tests/test_dockerfile.py lints this with hadolint and runs its pip steps in a clean venv.

# The builder: unitscale's wheel, and a wheel of each of its runtime dependencies.
FROM python:3.11.13-slim-trixie AS builder
WORKDIR /src
COPY pyproject.toml README.md ./
COPY unitscale/ unitscale/
COPY replay/ replay/
COPY scaler/ scaler/
COPY exporter/ exporter/
COPY serving/ serving/
COPY admission/ admission/
COPY foundation/ foundation/
COPY protos/ protos/
RUN python -m pip wheel --no-cache-dir --disable-pip-version-check --wheel-dir /wheels .

# The runtime: the same Python, only those wheels installed (from the builder, never the
# index), and no build tools: the base image's setuptools and wheel are removed.
FROM python:3.11.13-slim-trixie
LABEL org.opencontainers.image.title="unitscale" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    python -m pip install --no-cache-dir --disable-pip-version-check --no-index \
        --find-links=/wheels /wheels/unitscale-*.whl \
    && python -m pip uninstall --yes --disable-pip-version-check setuptools wheel
# Unbuffered logs; nothing written beside the code (the root filesystem is read-only in
# deploy/); matplotlib (replay's plots) keeps its cache in /tmp.
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MPLCONFIGDIR=/tmp/matplotlib
# 65532: the runAsUser/runAsGroup of deploy/'s pods; no account needed for it.
USER 65532:65532
ENTRYPOINT ["unitscale"]
CMD ["--help"]
