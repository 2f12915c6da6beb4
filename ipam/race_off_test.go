//go:build !race

package ipam

const raceEnabled = false
