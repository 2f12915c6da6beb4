package jsonscan_test

import (
	"encoding/json"
	"fmt"

	"github.com/vmipam/vmipam/lib/jsonscan"
)

func ExampleExtract() {
	body := []byte(`{"request":{"uid":"705ab4f5","object":{
		"metadata":{"name":"web-0","annotations":{"vmipam.io\/pool":"frontend"}},
		"spec":{"addresses":["10.20.0.17"]},
		"status":{"conditions":[{"type":"Ready","status":"True"}]}}}}`)
	if !json.Valid(body) {
		return
	}
	v := jsonscan.Extract(body,
		[]string{"request", "object", "metadata", "name"},
		[]string{"request", "object", "metadata", "annotations", "vmipam.io/pool"},
		[]string{"request", "object", "metadata", "annotations", "vmipam.io/token"},
		[]string{"request", "object", "spec", "addresses"},
	)
	name, _ := jsonscan.String(v[0])
	pool, _ := jsonscan.String(v[1])
	addrs, err := jsonscan.Strings(v[3], 1)
	fmt.Printf("%s in pool %s, token present: %v, addresses %q (%v)\n", name, pool, v[2] != nil, addrs, err)
	// Output: web-0 in pool frontend, token present: false, addresses ["10.20.0.17"] (<nil>)
}

func ExampleMembers() {
	labels := []byte(`{"app":"web","tier":"frontend","app":"api"}`)
	var app []byte
	_ = jsonscan.Members(labels, func(key, value []byte) bool {
		if jsonscan.KeyEquals(key, "app") {
			app = value // the last one wins, as with encoding/json
		}
		return true
	})
	fmt.Println(string(app))
	// Output: "api"
}
