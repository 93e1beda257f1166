# A stand-in for the official postgres image, from Debian's packages (a machine without an image
# registry: the test of compose.yaml). It reads the same POSTGRES_USER/PASSWORD/DB variables and
# keeps its data in the same folder.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends postgresql-15 \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /var/lib/postgresql/data /var/run/postgresql \
 && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql
COPY postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint.sh
ENV PATH=/usr/lib/postgresql/15/bin:$PATH PGDATA=/var/lib/postgresql/data
USER postgres
VOLUME /var/lib/postgresql/data
ENTRYPOINT ["sh", "/usr/local/bin/postgres-entrypoint.sh"]
