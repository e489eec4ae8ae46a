// Command shaper runs internal/shaper in front of one address, for
// scripts/bench shaped:
//
//	shaper -upstream 127.0.0.1:7070 [-listen 127.0.0.1:0] [-rate 94371840] [-latency 3ms] [-stats FILE]
//
// It prints the address it listens on, then serves until SIGINT or SIGTERM.
// With -stats it keeps FILE holding the number of connections accepted so
// far (a client that reuses its connections opens few).
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/ferrykit/ferry/internal/shaper"
)

func main() {
	upstream := flag.String("upstream", "", "address to forward to (HOST:PORT)")
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	rate := flag.Int64("rate", shaper.DefaultBytesPerSecond, "bytes per second per connection and direction (< 0: unlimited)")
	latency := flag.Duration("latency", shaper.DefaultLatency, "delay per direction (< 0: none)")
	stats := flag.String("stats", "", "file kept holding the number of connections accepted")
	flag.Parse()
	p, err := shaper.Start(shaper.Config{Listen: *listen, Upstream: *upstream, BytesPerSecond: *rate, Latency: *latency})
	if err != nil {
		fmt.Fprintln(os.Stderr, "shaper:", err)
		os.Exit(2)
	}
	fmt.Println(p.Addr())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	last := int64(-1)
	for {
		select {
		case <-sig:
			writeStats(*stats, p.Accepted())
			p.Close()
			return
		case <-tick.C:
			if n := p.Accepted(); n != last && *stats != "" {
				writeStats(*stats, n)
				last = n
			}
		}
	}
}

func writeStats(path string, n int64) {
	if path == "" {
		return
	}
	tmp := path + ".tmp"
	if os.WriteFile(tmp, []byte(strconv.FormatInt(n, 10)+"\n"), 0o644) == nil {
		os.Rename(tmp, path)
	}
}
