# syntax=docker/dockerfile:1
# ferry (the proxy by default) as a static binary on distroless, non-root.
#
#   docker build -t ferry .
#   docker run --rm -v $PWD/proxy.yaml:/etc/ferry/proxy.yaml:ro -p 9092-9095:9092-9095 -p 9644:9644 ferry
#
# deploy/deploy_test.go checks this file (stages, CGO_ENABLED=0, non-root
# USER) and builds the binary with the same command as the build stage.

ARG GO_VERSION=1.26
FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags="-s -w" -o /out/ferry ./cmd/ferry

# distroless/static: CA certificates (TLS to brokers and object stores),
# tzdata, /etc/passwd with the nonroot user (65532); no shell.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ferry /usr/local/bin/ferry
USER 65532:65532
# 9092 bootstrap, 9093+N broker node id N (broker.port.base), 9644 admin (/metrics, /healthz, /livez).
EXPOSE 9092 9093 9094 9095 9644
ENTRYPOINT ["/usr/local/bin/ferry"]
CMD ["proxy", "--config", "/etc/ferry/proxy.yaml"]
