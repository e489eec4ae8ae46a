package cli

import (
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
	return &progress{bar: progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(s.stderr),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionShowBytes(true),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionClearOnFinish(),
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
