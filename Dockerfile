# Builds the vmipam image: a static binary on distroless, non-root.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/vmipam ./cmd/vmipam

FROM gcr.io/distroless/static:nonroot
COPY --from=build /out/vmipam /vmipam
USER 65532:65532
ENTRYPOINT ["/vmipam"]
