// Command kubectl-vmipam is the kubectl plugin of vmipam: kubectl vmipam
// who, history, pools, check and release (package ctl). Install it with
// go install github.com/vmipam/vmipam/cmd/kubectl-vmipam@latest, or with
// krew from deploy/krew/vmipam.yaml.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/vmipam/vmipam/ctl"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := ctl.NewRoot(genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}).ExecuteContext(ctx)
	stop()
	if err != nil && !ctl.Silent(err) {
		fmt.Fprintln(os.Stderr, "error:", err)
	}
	os.Exit(ctl.ExitCode(err))
}
