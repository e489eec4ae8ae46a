package cli

import (
	"bytes"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// releaseProgramPages unmaps, from this process only, the pages of its own
// program file's read-only mappings (code and read-only data) that are
// mapped now, and returns how many bytes of address space it covered.
// `ferry proxy` calls it once it serves: start-up (package initialisation of
// the cloud SDKs, the wasm runtime and the rest, opening the store) touches
// tens of MiB of the 100 MiB program that serving never runs again, and the
// kernel maps the page cache around each page touched (fault-around, large
// folios), so an idle proxy showed 63-69 MiB of file-backed RSS of which
// serving needs about 30. The pages are clean copies of the file: the page
// cache keeps them, and those the proxy runs are mapped again on their
// next use (minor faults, no I/O). The writable data segment is not
// touched. Errors (no /proc, a kernel that refuses) leave the mappings as
// they are.
func releaseProgramPages() int64 {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return 0
	}
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return 0
	}
	var released int64
	for _, m := range programMappings(smaps, exe) {
		if _, _, e := unix.Syscall(unix.SYS_MADVISE, uintptr(m.start), uintptr(m.end-m.start), unix.MADV_DONTNEED); e == 0 {
			released += int64(m.end - m.start)
		}
	}
	return released
}

// mapping is an address range of the program file.
type mapping struct{ start, end uint64 }

// programMappings returns, from /proc/self/smaps, the private read-only
// mappings of the file exe that hold no anonymous page: only their pages
// are all clean copies of the file. A read-only mapping with anonymous
// pages is one the loader or runtime wrote before protecting it (a
// position-independent build's relocated RELRO data): dropping those pages
// would map the file's unrelocated bytes back, so it is left alone.
func programMappings(smaps []byte, exe string) []mapping {
	var out []mapping
	var cur *mapping // the mapping whose fields are being read, if a candidate
	flush := func() {
		if cur != nil {
			out = append(out, *cur)
		}
		cur = nil
	}
	for _, line := range bytes.Split(smaps, []byte{'\n'}) {
		f := bytes.Fields(line)
		if len(f) == 0 {
			continue
		}
		if k := f[0]; len(k) > 0 && k[len(k)-1] == ':' { // a field of the current mapping
			if cur != nil && string(k) == "Anonymous:" && (len(f) < 2 || string(f[1]) != "0") {
				cur = nil // written pages: not a clean copy of the file
			}
			continue
		}
		// A mapping's first line: "lo-hi perms offset dev inode path".
		flush()
		if len(f) < 6 || string(bytes.Join(f[5:], []byte{' '})) != exe {
			continue
		}
		if perms := f[1]; len(perms) != 4 || perms[0] != 'r' || perms[1] != '-' || perms[3] != 'p' {
			continue // only private read-only mappings
		}
		lo, hi, ok := bytes.Cut(f[0], []byte{'-'})
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(string(lo), 16, 64)
		end, err2 := strconv.ParseUint(string(hi), 16, 64)
		if err1 != nil || err2 != nil || end <= start {
			continue
		}
		cur = &mapping{start, end}
	}
	flush()
	return out
}
