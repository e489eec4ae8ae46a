// Command ferry produces and consumes large Kafka messages through a
// payload store (KIP-1159). See "ferry --help".
package main

import (
	"fmt"
	"os"
	"runtime/pprof"

	"github.com/ferrykit/ferry/internal/cli"
)

func main() { os.Exit(run()) }

// run is cli.Execute with, when FERRY_CPUPROFILE names a file (a hidden
// switch for benchmarks: docs/BENCHMARKS.md), a CPU profile of the whole
// command written there.
func run() int {
	if name := os.Getenv("FERRY_CPUPROFILE"); name != "" {
		f, err := os.Create(name)
		if err != nil {
			fmt.Fprintln(os.Stderr, "ferry: FERRY_CPUPROFILE:", err)
			return cli.ExitUsage
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "ferry: FERRY_CPUPROFILE:", err)
			return cli.ExitUsage
		}
		defer func() {
			pprof.StopCPUProfile()
			f.Close()
		}()
	}
	return cli.Execute()
}
