# dpcluster's two binaries, coordinator and node, on Debian slim with the
# Fashion-MNIST package, in two images (targets) of the same programs:
#
#   openblas (the default): built with -tags openblas (cgo), the fastest
#     CPU back end, about 4× the pure-Go one on the mlp
#     (docs/BENCHMARKS.md); it needs the OpenBLAS library, installed in
#     the image (libopenblas0).
#   static: static, pure-Go binaries (CGO_ENABLED=0, the gonum back end),
#     which run on any Linux of the architecture; copy them out of the image
#     to use them elsewhere.
#
# docker-compose.yml runs a whole cluster from the default image; alone:
#
#   docker build -t dpcluster .                          # openblas
#   docker build --target static -t dpcluster:static .   # pure Go
#   docker run --rm dpcluster coordinator --help
#   docker run --rm dpcluster node --help

# Static, pure-Go binaries: no cgo, so they run on any slim base.
FROM golang:1.26 AS build-static
WORKDIR /src
# Modules first, so that a source change does not download them again.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -o /out/ ./cmd/coordinator ./cmd/node

# The OpenBLAS build, on the release the runtime image uses (its glibc and
# libopenblas), with the Go toolchain of the golang image (a static program).
FROM debian:bookworm-slim AS build-openblas
COPY --from=golang:1.26 /usr/local/go /usr/local/go
ENV PATH=/usr/local/go/bin:$PATH GOTOOLCHAIN=local
RUN apt-get update \
	&& apt-get install -y --no-install-recommends ca-certificates gcc libc6-dev libopenblas-dev \
	&& rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=1 go build -trimpath -tags openblas -o /out/ ./cmd/coordinator ./cmd/node

# What both images share: the data, the user and the directories.
FROM debian:bookworm-slim AS runtime
# dataset-fashion-mnist installs the data where the binaries look for it
# by default (/usr/share/datasets/fashion-mnist). To use other files,
# mount a directory and pass --data DIR (or set DPCLUSTER_DATA) instead.
RUN apt-get update \
	&& apt-get install -y --no-install-recommends dataset-fashion-mnist \
	&& rm -rf /var/lib/apt/lists/* \
	&& useradd --system --create-home --home-dir /var/lib/dpcluster dpcluster \
	&& install -d -m 0700 -o dpcluster -g dpcluster /certs /ca
# A coordinator's Raft log, snapshots and privacy ledger go under its
# --data-dir: mount a volume at /var/lib/dpcluster (owned by dpcluster) so
# that they outlive the container. /certs is where docker-compose.yml puts
# the run's certificates (coordinator certs init) and /ca the CA's key, both
# owned by dpcluster so that a new volume mounted there is too.
WORKDIR /var/lib/dpcluster
CMD ["coordinator", "--help"]

FROM runtime AS static
COPY --from=build-static /out/coordinator /out/node /usr/local/bin/
USER dpcluster

# The default image (the last stage): the OpenBLAS back end.
FROM runtime AS openblas
RUN apt-get update \
	&& apt-get install -y --no-install-recommends libopenblas0 \
	&& rm -rf /var/lib/apt/lists/*
COPY --from=build-openblas /out/coordinator /out/node /usr/local/bin/
USER dpcluster
