// Command ferry produces and consumes large Kafka messages through a
// payload store (KIP-1159). See "ferry --help".
package main

import (
	"os"

	"github.com/ferrykit/ferry/internal/cli"
)

func main() { os.Exit(cli.Execute()) }
