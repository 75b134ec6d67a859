# Worker image for the Durable Recursive Reflector: `docker build -t rr .`
# The same image runs any `rr` command; the default is a worker polling the task queue.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY . /src
RUN pip install . \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin rr \
    && mkdir -p /data/blobs \
    && chown -R rr:rr /data

# Non-root: the worker executes model-written code in its sandbox processes.
USER rr
WORKDIR /home/rr
ENV RR_HOME=/home/rr/.rr \
    RR_BLOB_DIR=/data/blobs
VOLUME ["/data/blobs"]

CMD ["rr", "worker"]
