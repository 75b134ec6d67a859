# Worker image for the Durable Recursive Reflector: `docker build -t rr .`
# The same image runs any `rr` command; the default is a worker polling the task queue.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A regular (non-editable) install into site-packages, with the prompts and examples as package data
# and the `s3` extra (boto3) for RR_BLOB_URL=s3://...; the source tree is removed afterwards.
WORKDIR /src
COPY . /src
# `uidmap` (newuidmap/newgidmap) and a subordinate id range for `rr`: its sandbox hosts then run as a
# subordinate uid that owns none of the worker's files (sandbox/isolation.py; without it the `uid` layer is
# reported missing and seccomp's denial of metadata calls is what holds).
RUN apt-get update && apt-get install -y --no-install-recommends uidmap && rm -rf /var/lib/apt/lists/* \
    && pip install ".[s3]" \
    && cd / && rm -rf /src \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin rr \
    && echo "rr:100000:65536" >> /etc/subuid && echo "rr:100000:65536" >> /etc/subgid

# Non-root: the worker executes model-written code in its sandbox processes (Landlock, seccomp and
# no-new-privs need no privileges; see docs/operations.md, Using a real cluster).
USER rr
WORKDIR /home/rr
# Blobs: with RR_BLOB_URL=s3://... (docker-compose.yml) a container keeps only a local cache (RR_BLOB_DIR,
# default under RR_HOME). With the default file store, RR_BLOB_DIR must be a volume shared by every worker
# and client.
ENV RR_HOME=/home/rr/.rr

CMD ["rr", "worker"]
