# Builds the vmipam image: a static binary on distroless, non-root.
#
# Both base images are pinned by digest, with the tag beside it for people:
# the digest is what is pulled, so a rebuild uses the same bytes until the
# pin is moved on purpose. To refresh them, resolve each tag's multi-platform
# index digest and replace the sha256 below, e.g.
#
#   docker buildx imagetools inspect golang:1.26 --format '{{json .Manifest.Digest}}'
#   docker buildx imagetools inspect gcr.io/distroless/static:nonroot --format '{{json .Manifest.Digest}}'
#
# (or crane digest <image:tag>), or let Renovate or Dependabot (docker
# ecosystem) propose the bump.
FROM golang:1.26@sha256:3c3e25a4da13fd0478eed2df1eb35a0e667094a7124d3993a6a1d30f71c17e79 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/vmipam ./cmd/vmipam

FROM gcr.io/distroless/static:nonroot@sha256:e2e927ec666bae08560abb3c55d0659eceabb657f56b6782ab500a9fc7f555e3
COPY --from=build /out/vmipam /vmipam
USER 65532:65532
ENTRYPOINT ["/vmipam"]
