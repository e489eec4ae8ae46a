package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Group and start-position properties that cannot be honoured are usage
// errors (exit 2) naming the key, before ferry connects (the broker
// address below answers nothing).
func TestConsumeGroupUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-X", "auto.offset.reset=none"}, "auto.offset.reset=none is not supported"},
		{[]string{"-X", "auto.offset.reset=smallest"}, "must be earliest or latest"},
		{[]string{"-X", "auto.offset.reset=earliest", "--from-beginning=false"}, "contradicts auto.offset.reset"},
		{[]string{"-X", "auto.offset.reset=latest", "--from-beginning"}, "contradicts auto.offset.reset"},
		{[]string{"--group", "g", "-X", "partition.assignment.strategy=fair"}, `unknown assignor "fair"`},
		{[]string{"--group", "g", "-X", "auto.commit.interval.ms=0"}, "auto.commit.interval.ms"},
		{[]string{"--group", "g", "-X", "enable.auto.commit=maybe"}, "enable.auto.commit"},
		{[]string{"--group", "g", "-X", "session.timeout.ms=-5"}, "session.timeout.ms"},
		{[]string{"-X", "group.idd=g"}, "did you mean group.id?"},
		{[]string{"-X", "isolation.level=committed"}, "must be read_uncommitted or read_committed"},
	} {
		r := run(t, nil, append([]string{"consume", "--brokers", "127.0.0.1:1", "-t", "t"}, tc.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
}

// partition.assignment.strategy takes Kafka's assignor names and the Java
// class names, in order of preference.
func TestParseBalancers(t *testing.T) {
	bs, err := parseBalancers("org.apache.kafka.clients.consumer.CooperativeStickyAssignor, range,roundrobin,sticky")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, b := range bs {
		names = append(names, b.ProtocolName())
	}
	if got := strings.Join(names, ","); got != "cooperative-sticky,range,roundrobin,sticky" {
		t.Errorf("balancers %s", got)
	}
	if _, err := parseBalancers(" , "); err == nil {
		t.Error("an empty list was accepted")
	}
}

// group.id is the flag's property; --group wins over it; without either,
// the group keys are ignored (with a warning) and no group is joined.
func TestParseGroup(t *testing.T) {
	g, err := parseGroup(map[string]string{"group.id": "a"}, "b", 0)
	if err != nil || g.id != "b" || !g.commit || len(g.opts) == 0 {
		t.Errorf("--group b over group.id=a: %+v, %v", g, err)
	}
	g, err = parseGroup(map[string]string{"group.id": " a ", "enable.auto.commit": "false"}, "", 0)
	if err != nil || g.id != "a" || g.commit {
		t.Errorf("group.id=a enable.auto.commit=false: %+v, %v", g, err)
	}
	g, err = parseGroup(map[string]string{"auto.commit.interval.ms": "10"}, "", 0)
	if err != nil || g.id != "" || len(g.opts) != 0 {
		t.Errorf("no group: %+v, %v", g, err)
	}
}

// isolation.level as Kafka's consumer: read_uncommitted (the default)
// returns the record of an aborted transaction, read_committed does not.
func TestConsumeIsolationLevel(t *testing.T) {
	brokers := newCluster(t)
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...), kgo.TransactionalID("ferry-cli-iso"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, tc := range []struct {
		value string
		end   kgo.TransactionEndTry
	}{{"aborted", kgo.TryAbort}, {"committed", kgo.TryCommit}} {
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "t", Value: []byte(tc.value)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := cl.EndTransaction(ctx, tc.end); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "abortedcommitted"},
		{[]string{"-X", "isolation.level=read_uncommitted"}, "abortedcommitted"},
		{[]string{"-X", "isolation.level=read_committed"}, "committed"},
	} {
		r := run(t, nil, append([]string{"consume", "--brokers", brokers, "-t", "t", "--timeout", "3s"}, tc.args...)...)
		if r.code != 0 || r.stdout != tc.want {
			t.Errorf("%v: exit %d, stdout %q; want 0 and %q", tc.args, r.code, r.stdout, tc.want)
		}
	}
}
