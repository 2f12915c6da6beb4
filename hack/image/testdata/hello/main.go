// Command hello stands in for vmipam in the image builder's test: a small
// static binary that uses one module from go.mod, for the SBOM to list.
package main

import (
	"fmt"

	"k8s.io/utils/ptr"
)

func main() { fmt.Println(*ptr.To("hello")) }
