package cli

import (
	"bytes"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// The first rate a bar shows is measured from the bar's creation, not from
// its first update: 64 KiB read at once must not show as "489 GB/s".
func TestProgressFirstRate(t *testing.T) {
	var out bytes.Buffer
	p := newBar(&out, 10<<20, "uploading x")
	p.add(64 << 10) // at once: too soon to show a rate
	time.Sleep(150 * time.Millisecond)
	p.add(64 << 10)
	time.Sleep(150 * time.Millisecond)
	p.add(64 << 10)
	rates := regexp.MustCompile(`([0-9.]+) ([kMGT]?B)/s`).FindAllStringSubmatch(out.String(), -1)
	if len(rates) == 0 {
		t.Fatalf("no rate shown: %q", out.String())
	}
	unit := map[string]float64{"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}
	for _, m := range rates {
		v, _ := strconv.ParseFloat(m[1], 64)
		// At most 192 KiB in at least 0.15 s since the bar was made.
		if rate := v * unit[m[2]]; rate > 192<<10/0.15 {
			t.Errorf("bar shows %s %s/s, more than was read since it was made allows; output %q", m[1], m[2], out.String())
		}
	}
}
