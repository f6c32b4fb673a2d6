# kvgate: multi-stage build of the static binary, run as a non-root user.
# Not built in CI: CI machines have no Docker engine. Build with `make docker`.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o /out/kvgate ./cmd/kvgate

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/kvgate /usr/local/bin/kvgate
USER nonroot:nonroot
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/kvgate"]
CMD ["serve", "--config", "/etc/kvgate/kvgate.yaml"]
