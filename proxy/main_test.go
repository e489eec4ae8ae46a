package proxy

import (
	"flag"
	"os"
	"testing"
)

// TestMain poisons the frames given back to the pools (poisonFrames) for
// the tests, not for the benchmarks, which measure what the proxy pays.
func TestMain(m *testing.M) {
	flag.Parse()
	poisonFrames = flag.Lookup("test.bench").Value.String() == ""
	os.Exit(m.Run())
}
