# Shiftlog's image: web, worker or both, by its command (docs/deploy.md, "Containers").
#   docker build -t shiftlog .                  (FROM debian:bookworm-slim)
#   docker build --build-arg BASE_IMAGE=shiftlog-base:bookworm -t shiftlog .
#     (a machine without an image registry: deploy/debian-base.sh makes that base from Debian's
#     packages)
#   docker run … shiftlog serve    web + worker + reaper in one container (the default)
#   docker run … shiftlog web      daphne alone (pages, API, WebSockets)
#   docker run … shiftlog worker   a huey consumer (runs' steps, the reaper)
#   docker run … shiftlog manage migrate --noinput   (any management command)
# Runs' commands are sandboxed with bubblewrap, which needs user namespaces the default seccomp
# profile refuses: docs/deploy.md says what to give the worker's container.
ARG BASE_IMAGE=debian:bookworm-slim

FROM ${BASE_IMAGE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/*
# The dependencies first, from pyproject.toml alone (an empty package), so that a change of code
# rebuilds only the last layers: the server's extras (PostgreSQL, Redis, S3); no browsers, no node.
COPY pyproject.toml setup.py /src/
RUN mkdir -p /src/templates /src/static && touch /src/README.md /src/LICENSE \
 && python3 -m venv /opt/shiftlog \
 && /opt/shiftlog/bin/pip install --no-cache-dir --progress-bar off '/src[postgres,redis,s3]'
COPY . /src
RUN /opt/shiftlog/bin/pip install --no-cache-dir --progress-bar off --no-deps --force-reinstall /src \
 && find /opt/shiftlog -name __pycache__ -prune -exec rm -rf {} +
# The static files, hashed, inside the image: a new image brings new names, so browsers never
# keep an old script. (A throwaway data folder and key: nothing of it stays in the image.)
RUN SHIFTLOG_DATA_DIR=/tmp/build-data SECRET_KEY=build-only SHIFTLOG_STATIC_ROOT=/opt/static \
    /opt/shiftlog/bin/shiftlog manage collectstatic --noinput -v 0 \
 && rm -rf /tmp/build-data

FROM ${BASE_IMAGE}
# python3: the interpreter Shiftlog runs on and the one runs' commands get by default;
# bubblewrap: the sandbox of runs' commands; tini: signals reach shiftlog, zombies are reaped.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 bubblewrap ca-certificates tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 shiftlog \
 && useradd --system --uid 10001 --gid shiftlog --home-dir /var/lib/shiftlog --create-home \
      --shell /usr/sbin/nologin shiftlog
COPY --from=build /opt/shiftlog /opt/shiftlog
COPY --from=build /opt/static /opt/static
ENV PATH=/opt/shiftlog/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    SHIFTLOG_DATA_DIR=/var/lib/shiftlog \
    SHIFTLOG_STATIC_ROOT=/opt/static \
    SHIFTLOG_LOG_FORMAT=json
# The data folder: SQLite and blobs in the single-container shape; workspaces (a cache, with an
# S3 store) and the data folder's keys otherwise. Mount a volume here.
VOLUME /var/lib/shiftlog
USER shiftlog
WORKDIR /var/lib/shiftlog
EXPOSE 8000
ENTRYPOINT ["tini", "--", "shiftlog"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
