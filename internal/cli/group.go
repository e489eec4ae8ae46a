package cli

import (
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The consumer-group properties ferry consume reads, in Kafka's consumer
// names (ConsumerConfig).
const (
	keyGroupID              = "group.id"
	keyAutoOffsetReset      = "auto.offset.reset"
	keyEnableAutoCommit     = "enable.auto.commit"
	keyAutoCommitInterval   = "auto.commit.interval.ms"
	keyAssignmentStrategy   = "partition.assignment.strategy"
	keySessionTimeout       = "session.timeout.ms"
	keyHeartbeatInterval    = "heartbeat.interval.ms"
	keyIsolationLevel       = "isolation.level"
	defaultAutoCommitPeriod = 5 * time.Second // Kafka's auto.commit.interval.ms default
)

// consumerKeys are the properties only ferry consume reads (the group's and
// its start position); produce and gc accept them too, with no effect, so
// that one client.properties serves every command.
func consumerKeys() []string {
	return []string{keyGroupID, keyAutoOffsetReset, keyEnableAutoCommit, keyAutoCommitInterval,
		keyAssignmentStrategy, keySessionTimeout, keyHeartbeatInterval, keyIsolationLevel}
}

// isolationLevel reads isolation.level as Kafka's consumer does:
// read_uncommitted (its default: records of aborted and open transactions
// are returned too) or read_committed (fetches end at the last stable
// offset, and aborted records are dropped). Errors are usage errors.
func isolationLevel(p map[string]string) (kgo.IsolationLevel, error) {
	v, ok := p[keyIsolationLevel]
	if !ok {
		return kgo.ReadUncommitted(), nil
	}
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "read_uncommitted":
		return kgo.ReadUncommitted(), nil
	case "read_committed":
		return kgo.ReadCommitted(), nil
	}
	return kgo.ReadUncommitted(), usageErrorf("consume: %s=%q: must be read_uncommitted or read_committed", keyIsolationLevel, v)
}

// groupConfig is how ferry consume joins a consumer group.
type groupConfig struct {
	id string // "": no group
	// commit: offsets are committed (enable.auto.commit, default true),
	// each only once its record was written out.
	commit bool
	opts   []kgo.Opt
}

// startOffset is where consume starts in a partition that has no committed
// offset (every partition without a group): the earliest offset by default,
// as ferry consume always did (kafka-console-consumer's default is the
// latest; --from-beginning=false or auto.offset.reset=latest give that).
// fromBeginningSet says --from-beginning was given; it and auto.offset.reset
// may not disagree (kafka-console-consumer refuses that too).
func startOffset(p map[string]string, fromBeginning, fromBeginningSet bool) (kgo.Offset, error) {
	earliest := fromBeginning
	if v, ok := p[keyAutoOffsetReset]; ok {
		var fromProp bool
		switch strings.ToLower(strings.TrimSpace(v)) {
		case "earliest":
			fromProp = true
		case "latest":
		case "none":
			return kgo.Offset{}, usageErrorf("consume: %s=none is not supported by ferry (use earliest or latest)", keyAutoOffsetReset)
		default:
			return kgo.Offset{}, usageErrorf("consume: %s=%q: must be earliest or latest", keyAutoOffsetReset, v)
		}
		if fromBeginningSet && fromProp != fromBeginning {
			return kgo.Offset{}, usageErrorf("consume: --from-beginning=%t contradicts %s=%s", fromBeginning, keyAutoOffsetReset, v)
		}
		earliest = fromProp
	}
	if earliest {
		return kgo.NewOffset().AtStart(), nil
	}
	return kgo.NewOffset().AtEnd(), nil
}

// parseGroup reads the group properties; groupFlag (--group) wins over
// group.id. maxPollInterval (max.poll.interval.ms) is the group's rebalance
// timeout, as in Kafka's Java consumer. Errors are usage errors.
func parseGroup(p map[string]string, groupFlag string, maxPollInterval time.Duration) (groupConfig, error) {
	g := groupConfig{id: strings.TrimSpace(p[keyGroupID]), commit: true}
	if groupFlag != "" {
		g.id = groupFlag
	}
	if g.id == "" {
		for _, k := range consumerKeys() {
			if _, ok := p[k]; ok && k != keyAutoOffsetReset && k != keyGroupID && k != keyIsolationLevel {
				slog.Warn("property has no effect without a consumer group (--group or group.id); ignored", "key", k)
			}
		}
		return g, nil
	}
	interval := defaultAutoCommitPeriod
	if v, ok := p[keyEnableAutoCommit]; ok {
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return g, usageErrorf("consume: %s=%q: must be true or false", keyEnableAutoCommit, v)
		}
		g.commit = b
	}
	ms := func(key string, dst *time.Duration) error {
		v, ok := p[key]
		if !ok {
			return nil
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 32)
		if err != nil || n <= 0 {
			return usageErrorf("consume: %s=%q: must be a positive number of milliseconds", key, v)
		}
		*dst = time.Duration(n) * time.Millisecond
		return nil
	}
	if err := ms(keyAutoCommitInterval, &interval); err != nil {
		return g, err
	}
	// Rebalances wait while polled records are being written
	// (BlockRebalanceOnPoll), as the Java consumer's happen only inside
	// poll: a partition is never handed to another member while this one
	// writes a record of it, and what was written is committed on revoke.
	g.opts = []kgo.Opt{kgo.ConsumerGroup(g.id), kgo.BlockRebalanceOnPoll()}
	if maxPollInterval > 0 {
		g.opts = append(g.opts, kgo.RebalanceTimeout(maxPollInterval))
	}
	if g.commit {
		// Only records marked as written are committed: every interval,
		// on revoke, on leaving, and by consume at the end.
		g.opts = append(g.opts, kgo.AutoCommitMarks(), kgo.AutoCommitInterval(interval))
	} else {
		g.opts = append(g.opts, kgo.DisableAutoCommit())
	}
	var session, heartbeat time.Duration
	if err := ms(keySessionTimeout, &session); err != nil {
		return g, err
	}
	if err := ms(keyHeartbeatInterval, &heartbeat); err != nil {
		return g, err
	}
	if session > 0 {
		g.opts = append(g.opts, kgo.SessionTimeout(session))
	}
	if heartbeat > 0 {
		g.opts = append(g.opts, kgo.HeartbeatInterval(heartbeat))
	}
	if v, ok := p[keyAssignmentStrategy]; ok {
		bs, err := parseBalancers(v)
		if err != nil {
			return g, err
		}
		g.opts = append(g.opts, kgo.Balancers(bs...))
	}
	return g, nil
}

// parseBalancers maps partition.assignment.strategy (a comma-separated
// list, in order of preference, of Kafka's assignor names or Java class
// names) onto franz-go's balancers.
func parseBalancers(v string) ([]kgo.GroupBalancer, error) {
	var bs []kgo.GroupBalancer
	for _, name := range strings.Split(v, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		short := strings.ToLower(strings.TrimSuffix(name[strings.LastIndex(name, ".")+1:], "Assignor"))
		switch short {
		case "range":
			bs = append(bs, kgo.RangeBalancer())
		case "roundrobin":
			bs = append(bs, kgo.RoundRobinBalancer())
		case "sticky":
			bs = append(bs, kgo.StickyBalancer())
		case "cooperative-sticky", "cooperativesticky":
			bs = append(bs, kgo.CooperativeStickyBalancer())
		default:
			return nil, usageErrorf("consume: %s: unknown assignor %q (range, roundrobin, sticky, cooperative-sticky)", keyAssignmentStrategy, name)
		}
	}
	if len(bs) == 0 {
		return nil, usageErrorf("consume: %s is empty", keyAssignmentStrategy)
	}
	return bs, nil
}
