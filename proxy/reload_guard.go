package proxy

import (
	"errors"
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferrykit/ferry/interceptor"
)

// A reload that fails safe (docs/OPERATIONS.md, "Reloading"): a half-written
// file (a ConfigMap cut short after `interceptors:` is valid YAML with an
// empty list) must not turn encryption off. A reload is refused, and the
// running chain kept, when it would
//   - leave the chain empty while interceptors run,
//   - remove an interceptor that protects data (protects), or
//   - narrow one: a change of its topic.pattern that is not provably a
//     superset of the running one (identical, or all topics), or of its side,
//
// unless the new configuration says reload.allow.unprotected: true.

// ErrReloadUnprotected: a reload would remove or narrow data protection
// (or empty the chain) and the configuration does not allow it
// (reload.allow.unprotected). The running chain is kept.
var ErrReloadUnprotected = errors.New("reload would leave data unprotected (set reload.allow.unprotected: true in the file to allow it)")

// protects reports whether the built-in interceptor name guards data:
// encrypt (records stored in plaintext without it), redact (fields
// reach the broker), validate-json and any other validate-* (malformed
// records accepted).
func protects(name string) bool {
	return name == "encrypt" || name == "redact" || strings.HasPrefix(name, "validate-")
}

// allTopics reports whether a topic.pattern matches every topic name
// (CompileTopicPattern: empty is ".*").
func allTopics(pattern string) bool {
	switch strings.TrimSpace(pattern) {
	case "", ".*":
		return true
	}
	return false
}

// covers reports whether next protects at least what running does:
// same interceptor, same side, and a topic pattern that is the same or
// matches every topic. Regular expressions are not compared for inclusion:
// any other change counts as a narrowing (conservative by design).
func covers(running, next interceptor.Spec) bool {
	if running.Name != next.Name {
		return false
	}
	side := func(s interceptor.Spec) string {
		return strings.ToLower(strings.TrimSpace(s.Config[interceptor.KeySide]))
	}
	if side(running) != side(next) {
		return false
	}
	rp, np := running.Config[interceptor.KeyTopicPattern], next.Config[interceptor.KeyTopicPattern]
	return allTopics(np) || strings.TrimSpace(rp) == strings.TrimSpace(np)
}

// unprotectedChanges lists what a reload from running to next would lose,
// one phrase each; empty: nothing.
func unprotectedChanges(running, next []interceptor.Spec) []string {
	var out []string
	if len(running) > 0 && len(next) == 0 {
		out = append(out, "the interceptor chain would be empty")
	}
	for _, r := range running {
		if !protects(r.Name) {
			continue
		}
		covered, sameName := false, false
		for _, n := range next {
			sameName = sameName || n.Name == r.Name
			if covers(r, n) {
				covered = true
				break
			}
		}
		pattern := r.Config[interceptor.KeyTopicPattern]
		switch {
		case covered:
		case sameName:
			out = append(out, fmt.Sprintf("%s (topic.pattern %q) would protect fewer topics or another side: a changed topic.pattern counts as narrower unless it is the same or .*", r.Name, pattern))
		default:
			out = append(out, fmt.Sprintf("%s (topic.pattern %q) would be removed", r.Name, pattern))
		}
	}
	return out
}

// checkProtection is nil when cfg may replace the running chain's specs,
// else ErrReloadUnprotected with what would be lost, counted in
// ferry_proxy_config_reloads_refused_unprotected_total.
func (s *Server) checkProtection(running []interceptor.Spec, cfg Config) error {
	lost := unprotectedChanges(running, cfg.Interceptors)
	if len(lost) == 0 {
		return nil
	}
	if cfg.ReloadAllowUnprotected {
		s.log.Warn("config reload removes or narrows data protection, allowed by reload.allow.unprotected", "changes", lost)
		return nil
	}
	s.rm.unprotected.Inc()
	return fmt.Errorf("%w: %s", ErrReloadUnprotected, strings.Join(lost, "; "))
}

func newUnprotectedCounter(reg *prometheus.Registry) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_proxy_config_reloads_refused_unprotected_total",
		Help: "Reloads refused because they would remove or narrow a protecting interceptor (encrypt, redact, validate-*) or empty the chain (reload.allow.unprotected not set); also counted as failures."})
	reg.MustRegister(c)
	return c
}
