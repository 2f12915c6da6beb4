//go:build race

package ipam

// raceEnabled: the race detector slows the property test some twenty
// times, so it runs fewer sequences; make fuzz and the plain run do more.
const raceEnabled = true
