// Command probe is a Pod of the e2e suite that dials for it: GET
// /dial?addr=host:port tries a TCP connection to addr from inside the Pod
// and answers with what happened ("connected", or the error). The suite
// uses it to show that a Pod's packets to an address outside the cluster,
// or to a ClusterIP kube-proxy has not programmed yet, never leave the
// machine.
package main

import (
	"fmt"
	"log"
	"net"
	"net/http"
	"time"
)

func main() {
	http.HandleFunc("/dial", func(w http.ResponseWriter, r *http.Request) {
		addr := r.URL.Query().Get("addr")
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			_, _ = fmt.Fprintf(w, "%v", err)
			return
		}
		_ = conn.Close()
		_, _ = fmt.Fprint(w, "connected")
	})
	http.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = fmt.Fprint(w, "ok") })
	srv := &http.Server{Addr: ":8080", ReadHeaderTimeout: 5 * time.Second}
	log.Fatal(srv.ListenAndServe())
}
