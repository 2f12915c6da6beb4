// Command pause is the sandbox ("pause") container of the single-node
// cluster `make e2e` runs: no registry can be reached there, so the image
// containerd starts first in every Pod is built here, with hack/image, from
// this program. Like Kubernetes' own pause, it holds the Pod's namespaces
// open, reaps the zombies it inherits as PID 1 of a shared PID namespace,
// and exits 0 on SIGINT or SIGTERM.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			// Reap every child that has exited; stop at the first that
			// has not (or when there are none).
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
