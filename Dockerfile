# kvgate: multi-stage build of the static binary, run as a non-root user.
# Not built in CI: CI machines have no Docker engine. Build with `make docker`, which passes the
# version (git describe) as VERSION: `kvgate version` in the image prints it.
FROM golang:1.26 AS build
ARG VERSION=dev
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/kvgate ./cmd/kvgate

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/kvgate /usr/local/bin/kvgate
USER nonroot:nonroot
# The config's default listen address is loopback, unreachable from outside a container: the
# image listens on every interface (a KVGATE_* variable overrides the file; set it to change).
ENV KVGATE_LISTEN=0.0.0.0:8080
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/kvgate"]
CMD ["serve", "--config", "/etc/kvgate/kvgate.yaml"]
