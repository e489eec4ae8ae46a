// Package observe holds Ferry's per-topic Prometheus metrics and its
// OpenTelemetry tracing: a payload store wrapper (Store) that counts, times
// and traces every store operation, the metrics of offloads, resolves,
// interceptor calls and rejections, and the W3C trace context carried in a
// record header (traceparent) so that a consumer's span links to the
// producer's.
//
// Nothing here registers globally: NewMetrics takes the caller's
// prometheus.Registerer, and tracing uses the trace.TracerProvider passed
// in (otlp.SetupTracing, in package observe/otlp, builds an OTLP one for the proxy). A nil
// *Metrics and a nil *Tracer do nothing, so library code calls them
// unconditionally.
package observe

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultMaxTopics is MetricsOptions.MaxTopics' default
// (metrics.topics.max).
const DefaultMaxTopics = 100

// OtherTopic is the topic label value of the topics past
// MetricsOptions.MaxTopics.
const OtherTopic = "other"

// Store operations, the operation label of the store metrics and the
// ferry.store.operation span attribute.
const (
	OpPublish  = "publish"  // PayloadStore.Publish (an object PUT)
	OpDownload = "download" // PayloadStore.Download (an object GET, the open)
	OpDelete   = "delete"   // PayloadStore.Delete
	OpStat     = "stat"     // ObjectStore.Stat (HEAD)
	OpCopy     = "copy"     // ObjectStore.Copy
	OpTouch    = "touch"    // ObjectStore.Touch
	OpMove     = "move"     // ObjectStore.Move
	OpRemove   = "remove"   // ObjectStore.Remove
	OpList     = "list"     // Lister.List, ObjectStore.ListKeys
	OpPut      = "put"      // ObjectStore.Put (gc's small objects)
	OpGet      = "get"      // ObjectStore.Get (gc's small objects)
)

var storeOps = [...]string{OpPublish, OpDownload, OpDelete, OpStat, OpCopy, OpTouch, OpMove, OpRemove, OpList, OpPut, OpGet}

type opIndex int

const (
	ixPublish opIndex = iota
	ixDownload
	ixDelete
	ixStat
	ixCopy
	ixTouch
	ixMove
	ixRemove
	ixList
	ixPut
	ixGet
)

// gcOnly marks ferry gc's own operations (lifecycle: quarantine moves,
// checkpoint and manifest objects). Ferry observes no store that gc works
// on (the proxy's large-message publishes, downloads, deletes, and stats,
// copies, touches, removes and lists for its reference rules and
// confirmations; ferry gc has no metrics), so these get their series at
// their first count, in a program that runs lifecycle.GC on an observed
// store, instead of zero-valued ones for every topic.
var gcOnly = [len(storeOps)]bool{ixMove: true, ixPut: true, ixGet: true}

// Directions, the direction label of the interceptor metrics.
const (
	DirectionProduce = "produce"
	DirectionFetch   = "fetch"
)

// MetricsOptions configure NewMetrics.
type MetricsOptions struct {
	// MaxTopics bounds the distinct values of the topic label
	// (metrics.topics.max, default DefaultMaxTopics): the first MaxTopics
	// topics seen get their own series, later ones are counted under
	// topic="other". 0 means the default; negative is an error.
	MaxTopics int
}

// ErrMaxTopics: MetricsOptions.MaxTopics is negative.
var ErrMaxTopics = errors.New("metrics.topics.max must be 0 (default) or more")

// Metrics are Ferry's per-topic collectors. Methods on a nil *Metrics do
// nothing. Safe for concurrent use.
type Metrics struct {
	maxTopics int

	offloadedRecords, offloadedBytes *prometheus.CounterVec
	resolvedRecords, resolvedBytes   *prometheus.CounterVec
	deliveredRecords, deliveredBytes *prometheus.CounterVec
	storeOps                         *prometheus.CounterVec
	storeSeconds                     *prometheus.HistogramVec
	icSeconds                        *prometheus.HistogramVec
	rejections                       *prometheus.CounterVec

	topics  sync.Map // topic -> *topicSeries
	mu      sync.Mutex
	nTopics atomic.Int64
	other   *topicSeries

	icMu  sync.Mutex
	icObs map[[2]string]prometheus.Observer

	wasmFailures *prometheus.CounterVec // module, direction, kind
}

// topicSeries are one topic's label children, made once: with the topic,
// except those of the gcOnly operations, made at their first count (once).
type topicSeries struct {
	topic                            string
	offloadedRecords, offloadedBytes prometheus.Counter
	resolvedRecords, resolvedBytes   prometheus.Counter
	deliveredRecords, deliveredBytes prometheus.Counter
	ok, failed                       [len(storeOps)]prometheus.Counter
	seconds                          [len(storeOps)]prometheus.Observer
	gcOnce                           [len(storeOps)]sync.Once
	rejMu                            sync.Mutex
	rej                              map[[2]string]prometheus.Counter
}

// NewMetrics makes the collectors and registers them with reg (nil: not
// registered, e.g. to read them in a test with prometheus/testutil).
// Errors: ErrMaxTopics; reg's error when a collector of the same name is
// registered already.
func NewMetrics(reg prometheus.Registerer, o MetricsOptions) (*Metrics, error) {
	if o.MaxTopics < 0 {
		return nil, ErrMaxTopics
	}
	if o.MaxTopics == 0 {
		o.MaxTopics = DefaultMaxTopics
	}
	m := &Metrics{maxTopics: o.MaxTopics, icObs: map[[2]string]prometheus.Observer{}}
	topic := []string{"topic"}
	m.offloadedRecords = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_offloaded_records_total",
		Help: "Payloads (a record's value, or its key) published to the payload store in place of the record's bytes, by topic."}, topic)
	m.offloadedBytes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_offloaded_bytes_total",
		Help: "Bytes of the payloads published to the payload store, by topic."}, topic)
	m.resolvedRecords = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_resolved_records_total",
		Help: "Payloads downloaded from the payload store and read to their end, by topic."}, topic)
	m.resolvedBytes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_resolved_bytes_total",
		Help: "Bytes read from payloads downloaded from the payload store, by topic."}, topic)
	m.deliveredRecords = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_resolved_delivered_records_total",
		Help: "Records the proxy's large-message interceptor delivered with their payloads restored, by topic, whether the payload was downloaded for them or served from large.message.payload.cache.max.bytes (ferry_resolved_records_total counts the downloads)."}, topic)
	m.deliveredBytes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_resolved_delivered_bytes_total",
		Help: "Key and value bytes of the records counted by ferry_resolved_delivered_records_total, by topic."}, topic)
	m.storeOps = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_store_operations_total",
		Help: "Payload store operations (publish, download, delete, stat, copy, touch, move, remove, list, put, get), retries included, by topic, operation and result (ok, error)."},
		[]string{"topic", "operation", "result"})
	m.storeSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ferry_store_operation_duration_seconds",
		Help:    "Time of a payload store operation with its retries (download: until the object is open), by topic and operation.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2.5, 14)}, []string{"topic", "operation"})
	m.icSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ferry_interceptor_duration_seconds",
		Help:    "Time of one interceptor call on one record, by interceptor and direction (produce, fetch).",
		Buckets: prometheus.ExponentialBuckets(0.00001, 4, 12)}, []string{"interceptor", "direction"})
	m.rejections = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_interceptor_rejections_total",
		Help: "Partitions the interceptors refused (produce) or failed (fetch), by topic, direction and reason (the Kafka error code's name, e.g. MESSAGE_TOO_LARGE, INVALID_RECORD, KAFKA_STORAGE_ERROR)."},
		[]string{"topic", "direction", "reason"})
	m.wasmFailures = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_wasm_failures_total",
		Help: "Calls of a WebAssembly interceptor module that failed their partition, by module (file name), direction (produce, fetch, init) and kind (trap, timeout, memory, bad_pointer, output_too_large, malformed_output, init); the instance was replaced."},
		[]string{"module", "direction", "kind"})
	if reg != nil {
		for _, c := range m.Collectors() {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	m.other = m.newSeries(OtherTopic)
	return m, nil
}

// Collectors returns the collectors, for a caller that registers them
// itself.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.offloadedRecords, m.offloadedBytes, m.resolvedRecords, m.resolvedBytes,
		m.deliveredRecords, m.deliveredBytes, m.storeOps, m.storeSeconds, m.icSeconds, m.rejections, m.wasmFailures}
}

// labelValue is v as a Prometheus label value: bytes that are not UTF-8
// (a topic name is whatever bytes a client's request holds; the broker
// refuses it only later) read as U+FFFD, where WithLabelValues would panic.
func labelValue(v string) string {
	if utf8.ValidString(v) {
		return v
	}
	return strings.ToValidUTF8(v, "\uFFFD")
}

func (m *Metrics) newSeries(topic string) *topicSeries {
	topic = labelValue(topic)
	s := &topicSeries{topic: topic,
		offloadedRecords: m.offloadedRecords.WithLabelValues(topic), offloadedBytes: m.offloadedBytes.WithLabelValues(topic),
		resolvedRecords: m.resolvedRecords.WithLabelValues(topic), resolvedBytes: m.resolvedBytes.WithLabelValues(topic),
		deliveredRecords: m.deliveredRecords.WithLabelValues(topic), deliveredBytes: m.deliveredBytes.WithLabelValues(topic),
		rej: map[[2]string]prometheus.Counter{}}
	for i := range storeOps {
		if !gcOnly[i] {
			m.makeOp(s, opIndex(i))
		}
	}
	return s
}

// makeOp makes s's children of op, each at zero: both results and the
// duration, so that rate() and error ratios see the operation's first
// count.
func (m *Metrics) makeOp(s *topicSeries, op opIndex) {
	s.ok[op] = m.storeOps.WithLabelValues(s.topic, storeOps[op], "ok")
	s.failed[op] = m.storeOps.WithLabelValues(s.topic, storeOps[op], "error")
	s.seconds[op] = m.storeSeconds.WithLabelValues(s.topic, storeOps[op])
}

// series returns topic's children: its own while fewer than maxTopics
// topics have been seen, else the "other" ones. A known topic costs one
// sync.Map lookup, no allocation.
func (m *Metrics) series(topic string) *topicSeries {
	if s, ok := m.topics.Load(topic); ok {
		return s.(*topicSeries)
	}
	if m.nTopics.Load() >= int64(m.maxTopics) {
		return m.other
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if s, ok := m.topics.Load(topic); ok {
		return s.(*topicSeries)
	}
	if m.nTopics.Load() >= int64(m.maxTopics) {
		return m.other
	}
	// LoadOrStore: two first uses of one topic at once count it once.
	s, loaded := m.topics.LoadOrStore(topic, m.newSeries(topic))
	if !loaded {
		m.nTopics.Add(1)
	}
	return s.(*topicSeries)
}

// Offloaded counts one payload of n bytes published for topic.
func (m *Metrics) Offloaded(topic string, n int64) {
	if m == nil {
		return
	}
	s := m.series(topic)
	s.offloadedRecords.Inc()
	s.offloadedBytes.Add(float64(n))
}

// Resolved counts one payload of n bytes downloaded for topic.
func (m *Metrics) Resolved(topic string, n int64) {
	if m == nil {
		return
	}
	s := m.series(topic)
	s.resolvedRecords.Inc()
	s.resolvedBytes.Add(float64(n))
}

// Delivered counts one record of n resolved key and value bytes delivered
// for topic (a download or a cache hit: Resolved counts downloads).
func (m *Metrics) Delivered(topic string, n int64) {
	if m == nil {
		return
	}
	s := m.series(topic)
	s.deliveredRecords.Inc()
	s.deliveredBytes.Add(float64(n))
}

// storeOp counts one store operation of topic ("" when the operation names
// no topic: counted under "other") and its duration.
func (m *Metrics) storeOp(topic string, op opIndex, d time.Duration, err error) {
	if m == nil {
		return
	}
	var s *topicSeries
	if topic == "" {
		s = m.other
	} else {
		s = m.series(topic)
	}
	if gcOnly[op] {
		s.gcOnce[op].Do(func() { m.makeOp(s, op) })
	}
	if err != nil {
		s.failed[op].Inc()
	} else {
		s.ok[op].Inc()
	}
	s.seconds[op].Observe(d.Seconds())
}

// Rejected counts a partition refused (produce) or failed (fetch) by the
// interceptors for topic, with reason the Kafka error name.
func (m *Metrics) Rejected(topic, direction, reason string) {
	if m == nil {
		return
	}
	s := m.series(topic)
	k := [2]string{direction, reason}
	s.rejMu.Lock()
	c := s.rej[k]
	if c == nil {
		c = m.rejections.WithLabelValues(s.topic, labelValue(direction), labelValue(reason))
		s.rej[k] = c
	}
	s.rejMu.Unlock()
	c.Inc()
}

// InterceptorObserver returns the histogram child of interceptor name's
// calls in direction, for the caller to keep and Observe seconds on (nil
// on a nil *Metrics).
func (m *Metrics) InterceptorObserver(name, direction string) prometheus.Observer {
	if m == nil {
		return nil
	}
	k := [2]string{name, direction}
	m.icMu.Lock()
	defer m.icMu.Unlock()
	o := m.icObs[k]
	if o == nil {
		o = m.icSeconds.WithLabelValues(labelValue(name), labelValue(direction))
		m.icObs[k] = o
	}
	return o
}

// WasmFailure counts a failed call of WebAssembly module (its file name)
// in direction, of kind (see ferry_wasm_failures_total's help).
func (m *Metrics) WasmFailure(module, direction, kind string) {
	if m == nil {
		return
	}
	m.wasmFailures.WithLabelValues(labelValue(module), labelValue(direction), labelValue(kind)).Inc()
}
