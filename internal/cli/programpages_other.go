//go:build !linux

package cli

// releaseProgramPages does nothing here (programpages_linux.go).
func releaseProgramPages() int64 { return 0 }
