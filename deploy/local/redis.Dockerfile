# A stand-in for the official redis image, from Debian's packages. As that image, it accepts
# connections from the compose network (no protected mode) and works in /data.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir /data && chown redis:redis /data
USER redis
WORKDIR /data
VOLUME /data
ENTRYPOINT ["sh", "-c", "exec \"$@\" --protected-mode no", "redis"]
CMD ["redis-server"]
