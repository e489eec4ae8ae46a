//go:build race

package interceptor

// raceEnabled: the race detector allocates on its own, so allocation
// counts are not checked under -race.
const raceEnabled = true
