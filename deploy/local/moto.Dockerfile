# An S3 server in place of MinIO (which Debian does not package): moto's server, from PyPI.
# It keeps objects in memory (no volume); good for a test, not for data.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/moto \
 && /opt/moto/bin/pip install --no-cache-dir --progress-bar off 'moto[server]>=5.0,<6'
USER nobody
# As PID 1 Python would ignore SIGTERM (no handler): `compose down` would wait out its timeout.
STOPSIGNAL SIGINT
ENTRYPOINT ["/opt/moto/bin/moto_server", "-H", "0.0.0.0", "-p", "9000"]
