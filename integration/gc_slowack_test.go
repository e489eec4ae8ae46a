package integration

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/internal/cli"
	"github.com/ferrykit/ferry/internal/storetest"
	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/lifecycle"
	"github.com/ferrykit/ferry/payloadstore"
)

// produceHold holds every Produce request a client writes to the broker
// while it is armed: a fault a real broker cannot be asked for (a produce
// that reaches the broker, and so is acknowledged, long after its payload
// was published: a stalled client, a long GC pause, a slow network). The
// client's connections go through holdConn (kgo.Dialer).
type produceHold struct {
	mu      sync.Mutex
	armed   bool
	release chan struct{}
	held    chan struct{} // gets a value when a request is held
}

func newProduceHold() *produceHold {
	return &produceHold{release: make(chan struct{}), held: make(chan struct{}, 16)}
}

func (h *produceHold) arm() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.armed, h.release = true, make(chan struct{})
}

// let releases the requests held and disarms.
func (h *produceHold) let() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.armed {
		h.armed = false
		close(h.release)
	}
}

func (h *produceHold) dialer() kgo.Opt {
	return kgo.Dialer(func(ctx context.Context, network, host string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, host)
		if err != nil {
			return nil, err
		}
		return &holdConn{Conn: c, h: h}, nil
	})
}

type holdConn struct {
	net.Conn
	h *produceHold
}

// Write holds a write that starts a Produce request (api key 0 after the
// 4-byte length; franz-go writes a request in one call) while armed.
func (c *holdConn) Write(b []byte) (int, error) {
	if len(b) >= 6 && binary.BigEndian.Uint16(b[4:6]) == 0 {
		c.h.mu.Lock()
		armed, release := c.h.armed, c.h.release
		c.h.mu.Unlock()
		if armed {
			select {
			case c.h.held <- struct{}{}:
			default:
			}
			<-release
		}
	}
	return c.Conn.Write(b)
}

// A produce whose acknowledgement arrives after a whole gc run (real broker,
// real S3): its payload, published before the run, is unreferenced in the
// log while gc decides, rechecks and deletes. The Producer confirms its
// objects after the acknowledgement and publishes the deleted one again:
// the record is readable. The control produces the same way but skips the
// confirmation (the behaviour before it): the record is unreadable. A third
// case lets the produce through while gc checks the records appended during
// its recheck: gc sees the settle rule broken, restores everything, deletes
// nothing and says so (ErrSettleExceeded).
func TestGCSlowAcknowledgement(t *testing.T) {
	storeURL := storetest.S3URL(t, "ferry-gc")
	gc := func(t *testing.T, topic string, store payloadstore.PayloadStore, progress func(lifecycle.Progress)) (lifecycle.Summary, error) {
		return lifecycle.Collect(ctxT(t, 3*time.Minute), client(t), store, lifecycle.Options{
			Topic: topic, Grace: 0, GraceSet: true, Settle: time.Second, SettleSet: true, Mode: lifecycle.ModeFull, Progress: progress})
	}
	// start produces one offloaded record with its Produce request held
	// and returns it once its object is published and the request held;
	// done gets the produce's error once acknowledged.
	start := func(t *testing.T, e *env, h *produceHold, topic string, confirm bool, seed uint64) (rec *kgo.Record, value []byte, done chan error) {
		value = randomBytes(seed, 4000)
		rec = &kgo.Record{Topic: topic, Value: bytes.Clone(value)}
		done = make(chan error, 1)
		h.arm()
		go func() {
			ctx := ctxT(t, 5*time.Minute)
			if confirm {
				done <- e.prod.ProduceSync(ctx, rec).FirstErr()
				return
			}
			if _, err := e.prod.PreparePlan(ctx, rec); err != nil {
				done <- err
				return
			}
			done <- e.prod.Client().ProduceSync(ctx, rec).FirstErr()
		}()
		select {
		case <-h.held:
		case err := <-done:
			t.Fatalf("produce finished while it should be held: %v", err)
		case <-time.After(2 * time.Minute):
			t.Fatal("the Produce request was never held")
		}
		return rec, value, done
	}
	resolve := func(t *testing.T, e *env, topic string) ([]byte, error) {
		recs := readAll(t, topic)
		if len(recs) != 1 {
			t.Fatalf("%d records in %s, want 1", len(recs), topic)
		}
		r := recs[0]
		err := largemessage.NewDeserializer(e.store, false).Resolve(ctxT(t, time.Minute), r)
		return r.Value, err
	}

	for _, c := range []struct {
		name    string
		confirm bool
	}{{"confirmed", true}, {"control-unconfirmed", false}} {
		t.Run(c.name, func(t *testing.T) {
			h := newProduceHold()
			e := storeEnv(t, storeURL, h.dialer())
			topic := newTopic(t, nil)
			_, value, done := start(t, e, h, topic, c.confirm, 7001)
			sum, err := gc(t, topic, e.store, nil)
			if err != nil {
				t.Fatal(err)
			}
			if sum.Deleted != 1 {
				t.Fatalf("gc deleted %d objects, want the held record's 1 (summary %+v)", sum.Deleted, sum)
			}
			h.let()
			if err := <-done; err != nil {
				t.Fatalf("produce: %v", err)
			}
			got, err := resolve(t, e, topic)
			if c.confirm {
				if err != nil || !bytes.Equal(got, value) {
					t.Fatalf("acknowledged record after gc: %v (equal bytes: %v)", err, bytes.Equal(got, value))
				}
				return
			}
			if !errors.Is(err, payloadstore.ErrPayloadNotFound) {
				t.Fatalf("control: resolving the unconfirmed record gave %v, want ErrPayloadNotFound (the loss the confirmation prevents)", err)
			}
		})
	}

	t.Run("late-during-recheck", func(t *testing.T) {
		h := newProduceHold()
		e := storeEnv(t, storeURL, h.dialer())
		topic := newTopic(t, nil)
		_, value, done := start(t, e, h, topic, false, 7002)
		var produceErr error
		released := false
		sum, err := gc(t, topic, e.store, func(p lifecycle.Progress) {
			if p.Phase == "late" && !released {
				// The recheck has read to its high watermarks: the
				// record is appended after them.
				released = true
				h.let()
				produceErr = <-done
			}
		})
		if !released {
			t.Fatal("gc never reached its late check")
		}
		if produceErr != nil {
			t.Fatalf("produce: %v", produceErr)
		}
		if !errors.Is(err, lifecycle.ErrSettleExceeded) {
			t.Fatalf("gc returned %v, want ErrSettleExceeded", err)
		}
		if sum.Deleted != 0 || len(sum.LateReferences) != 1 || sum.LateReferences[0].Deleted || sum.LateReferences[0].Topic != topic {
			t.Fatalf("summary %+v, want nothing deleted and one late reference", sum)
		}
		if !strings.Contains(err.Error(), fmt.Sprintf("topic %s partition 0 offset 0", topic)) {
			t.Fatalf("error does not name the record: %v", err)
		}
		got, err := resolve(t, e, topic)
		if err != nil || !bytes.Equal(got, value) {
			t.Fatalf("record after a run that broke the settle rule: %v", err)
		}
	})
}

// gc of a topic with a byte-for-byte mirror in the same cluster: once the
// topic's own records are gone, its objects are referenced by the mirror
// only. Without --mirror, gc would delete them (dry run); with it, it keeps
// them, and the mirror's records resolve (large.message.reference.resolve.topics).
func TestGCMirror(t *testing.T) {
	b := brokers(t)
	storeURL := fileStoreURL(t)
	e := storeEnv(t, storeURL)
	topic, mirror := newTopic(t, nil), newTopic(t, nil)
	var recs []*kgo.Record
	for i := range 3 {
		recs = append(recs, &kgo.Record{Topic: topic, Value: randomBytes(uint64(8000+i), 3000+i)})
	}
	produceOK(t, e, recs...)
	// The mirror: the records as stored, copied byte for byte.
	cl := client(t)
	for _, r := range readAll(t, topic) {
		m := &kgo.Record{Topic: mirror, Key: r.Key, Value: r.Value, Headers: r.Headers}
		if err := cl.ProduceSync(ctxT(t, time.Minute), m).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	// Retention passes the topic's records.
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(ctxT(t, time.Minute), topic)
	if err != nil {
		t.Fatal(err)
	}
	var offs kadm.Offsets
	ends.Each(func(lo kadm.ListedOffset) {
		offs.Add(kadm.Offset{Topic: topic, Partition: lo.Partition, At: lo.Offset})
	})
	if _, err := adm.DeleteRecords(ctxT(t, time.Minute), offs); err != nil {
		t.Fatal(err)
	}

	run := func(args ...string) string {
		var out, errb bytes.Buffer
		args = append([]string{"gc", "--brokers", b, "--topic", topic, "--store", storeURL, "--grace", "0s", "--settle", "1s"}, args...)
		if code := cli.Run(ctxT(t, 3*time.Minute), args, &out, &errb); code != cli.ExitOK {
			t.Fatalf("ferry %v exited %d: %s", args, code, errb.String())
		}
		return out.String()
	}
	if out := run("--dry-run"); !strings.Contains(out, "3 would delete") {
		t.Fatalf("control: without --mirror gc should find the 3 objects garbage:\n%s", out)
	}
	if out := run("--mirror", mirror); !strings.Contains(out, "3 kept referenced") || !strings.Contains(out, " 0 deleted") {
		t.Fatalf("with --mirror gc must keep the 3 objects:\n%s", out)
	}
	cfg := e.cfg
	cfg.ResolveTopics = regexp.MustCompile("^" + regexp.QuoteMeta(topic) + "$")
	de := cfg.NewDeserializer(e.store)
	got := readAll(t, mirror)
	if len(got) != 3 {
		t.Fatalf("%d records in the mirror, want 3", len(got))
	}
	for i, r := range got {
		if err := de.Resolve(ctxT(t, time.Minute), r); err != nil {
			t.Fatalf("mirror record %d after gc: %v", i, err)
		}
		if !bytes.Equal(r.Value, randomBytes(uint64(8000+i), 3000+i)) {
			t.Fatalf("mirror record %d resolved to other bytes", i)
		}
	}
	// A mirror that does not exist is an error, before anything is done.
	var out, errb bytes.Buffer
	if code := cli.Run(ctxT(t, time.Minute), []string{"gc", "--brokers", b, "--topic", topic, "--store", storeURL, "--mirror", "ferry-it-no-such-mirror"}, &out, &errb); code != cli.ExitFailure || !strings.Contains(errb.String(), "ferry-it-no-such-mirror") {
		t.Fatalf("missing mirror: exit %d, stderr %q", code, errb.String())
	}
}
