package cli

import (
	"io"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progress is a progress bar on stderr; a nil *progress draws nothing, so
// callers need not check whether bars are enabled.
type progress struct{ bar *progressbar.ProgressBar }

// bar returns a byte-count bar of total bytes (-1: unknown, a spinner) on
// s.stderr, or nil when progress bars are off.
func (s *sender) bar(total int64, desc string) *progress {
	if !s.progress {
		return nil
	}
	return newBar(s.stderr, total, desc)
}

// newBar draws a byte-count bar of total bytes (-1: a spinner) on w at
// once: the bar's clock starts now, so its first rate is the bytes counted
// over the time since it appeared (progressbar's clock would otherwise
// start at the first update, and a first 64 KiB read in microseconds
// would read as hundreds of GB/s). It is redrawn at most every 100 ms.
func newBar(w io.Writer, total int64, desc string) *progress {
	return &progress{bar: progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionShowBytes(true),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionClearOnFinish(),
		progressbar.OptionSetRenderBlankState(true),
	)}
}

// Write counts len(p) bytes, so a bar can sit in an io.MultiWriter.
func (p *progress) Write(b []byte) (int, error) {
	p.add(len(b))
	return len(b), nil
}

func (p *progress) add(n int) {
	if p != nil && n > 0 {
		p.bar.Add64(int64(n))
	}
}

func (p *progress) set(n int64) {
	if p != nil {
		p.bar.Set64(n)
	}
}

func (p *progress) finish() {
	if p != nil {
		p.bar.Finish()
	}
}
