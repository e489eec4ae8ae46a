package interceptor

import (
	"context"
	"errors"
	"fmt"
	"github.com/ferrykit/ferry/observe"
	"strconv"
	"strings"
	"time"
)

// Spec names one configured interceptor: a registered name and its
// configuration (the proxy's YAML `interceptors:` list, or
// `--interceptors NAME` with flags turned into keys).
type Spec struct {
	Name   string
	Config map[string]string
}

// ParseTimeout reads produce.request.interceptor.timeout.ms (default
// DefaultTimeout) from a configuration map.
func ParseTimeout(config map[string]string) (time.Duration, error) {
	v, ok := config[KeyTimeout]
	if !ok || strings.TrimSpace(v) == "" {
		return DefaultTimeout, nil
	}
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s: %q is not a positive number of ms", KeyTimeout, v)
	}
	return time.Duration(n) * time.Millisecond, nil
}

// Build builds the interceptors of specs, in order, into a chain. On error
// the instances already built are closed. Close the chain when done.
func Build(ctx context.Context, specs []Spec, o Options) (*Chain, error) {
	if o.Memory == nil {
		o.Memory = NewMemory(DefaultMemoryMax) // made here so the factories charge the chain's budget
	}
	ctx = context.WithValue(ctx, observeKey{}, observed{o.Metrics, o.Tracer, o.Memory, o.Timeout})
	var ins []Instance
	for i, s := range specs {
		in, err := New(ctx, s.Name, s.Config)
		if err != nil {
			closeAll(ins)
			return nil, fmt.Errorf("interceptors[%d]: %w", i, err)
		}
		ins = append(ins, in)
	}
	c := NewChain(ins, o)
	c.instances = ins
	return c, nil
}

// Close releases the resources of the instances Build made (payload
// stores). Calls made through the chain must have returned; a call the
// chain abandoned at its timeout may still run (and undo its work through
// the store): then Close returns nil at once and the instances are closed
// when the last such call ends.
func (c *Chain) Close() error {
	c.callMu.Lock()
	if c.closing {
		c.callMu.Unlock()
		return nil
	}
	c.closing = true
	running := c.calls
	c.callMu.Unlock()
	if running > 0 {
		return nil // leave closes them
	}
	return c.closeInstances()
}

func closeAll(ins []Instance) error {
	var errs []error
	for _, in := range ins {
		if in.Close != nil {
			errs = append(errs, in.Close())
		}
	}
	return errors.Join(errs...)
}

// observeKey carries Options.Metrics, Options.Tracer and Options.Memory to
// the built-in factories Build calls.
type observeKey struct{}

type observed struct {
	m   *observe.Metrics
	tr  *observe.Tracer
	mem *Memory
	t   time.Duration
}

// BuildEnv is what Build gives a Factory besides its configuration: the
// chain's metrics (nil: none), memory budget (proxy.memory.max.bytes) and
// time budget of one call (produce.request.interceptor.timeout.ms). A
// factory called outside Build gets nil metrics, a budget of its own and
// DefaultTimeout.
type BuildEnv struct {
	Metrics *observe.Metrics
	Memory  *Memory
	Timeout time.Duration
}

// EnvFrom returns the BuildEnv of a Factory's ctx.
func EnvFrom(ctx context.Context) BuildEnv {
	o, _ := ctx.Value(observeKey{}).(observed)
	e := BuildEnv{Metrics: o.m, Memory: o.mem, Timeout: o.t}
	if e.Memory == nil {
		e.Memory = NewMemory(DefaultMemoryMax)
	}
	if e.Timeout <= 0 {
		e.Timeout = DefaultTimeout
	}
	return e
}

// memoryFrom returns the memory budget Build was given (nil outside Build).
func memoryFrom(ctx context.Context) *Memory {
	o, _ := ctx.Value(observeKey{}).(observed)
	return o.mem
}

// observedFrom returns the metrics and tracer Build was given (nil, nil
// outside Build).
func observedFrom(ctx context.Context) (*observe.Metrics, *observe.Tracer) {
	o, _ := ctx.Value(observeKey{}).(observed)
	return o.m, o.tr
}
