// Package transport carries admission reviews between the API server and
// vmipam's admission handlers over HTTP. Reviews turns HTTP requests into
// admission reviews for an admission.Handler under Limits: request body
// size, bytes and requests in flight, read time and the request's own
// deadline; it decodes the AdmissionReview envelope without copying the
// objects it carries, and encodes the answer with a hand-written encoder
// where a benchmark showed it matters. Listener is the TLS HTTP server the
// manager runs as its controller-runtime webhook.Server, with the methods
// a drain needs to retire the connections the API server keeps alive.
//
// It must not know the handlers: it imports nothing of package webhook
// and decides nothing about an object; whatever an answer says comes from
// the handler. It holds no Kubernetes client.
package transport
