# dpcluster's two binaries, coordinator and node, on Debian slim with the
# Fashion-MNIST package. docker-compose.yml runs a whole cluster from it;
# alone:
#
#   docker build -t dpcluster .
#   docker run --rm dpcluster coordinator --help
#   docker run --rm dpcluster node --help

FROM golang:1.26 AS build
WORKDIR /src
# Modules first, so that a source change does not download them again.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# Static, pure-Go binaries (no cgo: the OpenBLAS back end is opt-in with
# -tags openblas and not built here), so they run on any slim base.
RUN CGO_ENABLED=0 go build -trimpath -o /out/ ./cmd/coordinator ./cmd/node

FROM debian:bookworm-slim
# dataset-fashion-mnist installs the data where the binaries look for it
# by default (/usr/share/datasets/fashion-mnist). To use other files,
# mount a directory and pass --data DIR (or set DPCLUSTER_DATA) instead.
RUN apt-get update \
	&& apt-get install -y --no-install-recommends dataset-fashion-mnist \
	&& rm -rf /var/lib/apt/lists/* \
	&& useradd --system --create-home --home-dir /var/lib/dpcluster dpcluster \
	&& install -d -m 0700 -o dpcluster -g dpcluster /certs /ca
COPY --from=build /out/coordinator /out/node /usr/local/bin/
USER dpcluster
# A coordinator's Raft log, snapshots and privacy ledger go under its
# --data-dir: mount a volume at /var/lib/dpcluster (owned by dpcluster) so
# that they outlive the container. /certs is where docker-compose.yml puts
# the run's certificates (coordinator certs init) and /ca the CA's key, both
# owned by dpcluster so that a new volume mounted there is too.
WORKDIR /var/lib/dpcluster
CMD ["coordinator", "--help"]
