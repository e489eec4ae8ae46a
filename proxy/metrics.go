package proxy

import (
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// metrics are one Server's Prometheus collectors, in their own registry (so
// several proxies can live in one process, as in tests).
type metrics struct {
	reg *prometheus.Registry

	connsActive      prometheus.Gauge
	connsTotal       *prometheus.CounterVec // listener: bootstrap|broker
	requests         *prometheus.CounterVec // api
	latency          *prometheus.HistogramVec
	bytesIn          prometheus.Counter
	bytesOut         prometheus.Counter
	errors           *prometheus.CounterVec // kind
	upstreamConnects *prometheus.CounterVec // result: ok|error
	rewrites         *prometheus.CounterVec // api
	listeners        prometheus.Gauge
	idleClosed       prometheus.Counter
	fetchStreamed    prometheus.Counter // Fetch responses streamFetch wrote

	// The children of requests and latency by API key, made at a key's
	// first use (a series appears at its first count) and kept, so the
	// hot path does not hash label values per request.
	requestsBy [metricKeys]atomic.Pointer[prometheus.Counter]
	latencyBy  [metricKeys]atomic.Pointer[prometheus.Observer]
}

// metricKeys: API keys below it have their children cached (Kafka's keys
// are below 100 today; others are counted through the label lookup).
const metricKeys = 128

// request counts a request of key.
func (m *metrics) request(key int16) {
	if key < 0 || int(key) >= metricKeys {
		m.requests.WithLabelValues(apiName(key)).Inc()
		return
	}
	c := m.requestsBy[key].Load()
	if c == nil {
		v := m.requests.WithLabelValues(apiName(key))
		c = &v
		m.requestsBy[key].Store(c)
	}
	(*c).Inc()
}

// observeLatency records the time a request of key took, in seconds.
func (m *metrics) observeLatency(key int16, seconds float64) {
	if key < 0 || int(key) >= metricKeys {
		m.latency.WithLabelValues(apiName(key)).Observe(seconds)
		return
	}
	o := m.latencyBy[key].Load()
	if o == nil {
		v := m.latency.WithLabelValues(apiName(key))
		o = &v
		m.latencyBy[key].Store(o)
	}
	(*o).Observe(seconds)
}

// observe registers the gauges read from the server's state: the memory
// budget in use, and the topic configuration lookups of the interceptors.
func (m *metrics) observe(s *Server) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ferry_proxy_memory_bytes",
		Help: "Bytes of proxy.memory.max.bytes in use now: frames read whole and interceptor work."},
		func() float64 { return float64(s.mem.InUse()) }))
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ferry_proxy_topic_config_requests_total",
		Help: "DescribeConfigs rounds the interceptors made to read topics' max.message.bytes (one per round, however many topics)."},
		func() float64 { return float64(s.ic.configs.Requests()) }))
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ferry_proxy_topic_id_lookups_total",
		Help: "Metadata requests the interceptors made to name topic ids (Produce and Fetch v13+) they had not seen."},
		func() float64 { return float64(s.ic.lookups.Load()) }))
}

func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.connsActive = prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_proxy_client_connections",
		Help: "Client connections open now."})
	m.connsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_proxy_client_connections_total",
		Help: "Client connections accepted, by listener (bootstrap or broker)."}, []string{"listener"})
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_proxy_requests_total",
		Help: "Requests forwarded, by API name."}, []string{"api"})
	m.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ferry_proxy_request_duration_seconds",
		Help:    "Time from a request read from the client to its response written back, by API name (acks=0 produce excluded).",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 14)}, []string{"api"})
	m.bytesIn = prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_proxy_client_bytes_received_total",
		Help: "Bytes of request frames read from clients, size prefixes included."})
	m.bytesOut = prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_proxy_client_bytes_sent_total",
		Help: "Bytes of response frames written to clients, size prefixes included."})
	m.errors = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_proxy_errors_total",
		Help: "Connections closed on an error, and partitions or connections refused, by kind (docs/PROXY.md lists every kind)."}, []string{"kind"})
	m.upstreamConnects = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_proxy_upstream_connects_total",
		Help: "Upstream broker connections opened (one per client connection; a client that reconnects after a broker restart opens a new one), by result."}, []string{"result"})
	m.rewrites = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_proxy_address_rewrites_total",
		Help: "Responses whose broker endpoints were rewritten, by API name."}, []string{"api"})
	m.listeners = prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_proxy_broker_listeners",
		Help: "Per-broker listeners open now (one per node id seen)."})
	m.fetchStreamed = prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_proxy_fetch_responses_streamed_total",
		Help: "Fetch responses (v12+, no interceptors) written to the client as they arrived from the broker, not read whole first."})
	m.idleClosed = prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_proxy_idle_connections_closed_total",
		Help: "Client connections closed after connections.max.idle.ms without a request or response."})
	m.reg.MustRegister(m.idleClosed, m.connsActive, m.connsTotal, m.requests, m.latency, m.bytesIn, m.bytesOut, m.errors,
		m.upstreamConnects, m.rewrites, m.fetchStreamed, m.listeners,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// apiNames caches kmsg's names by key, so the hot path does not build label
// strings.
var apiNames = func() []string {
	n := make([]string, maxKey)
	for k := range n {
		n[k] = kmsg.NameForKey(int16(k))
		if n[k] == "" || n[k] == "Unknown" {
			n[k] = strconv.Itoa(k)
		}
	}
	return n
}()

func apiName(key int16) string {
	if key >= 0 && int(key) < len(apiNames) {
		return apiNames[key]
	}
	return strconv.Itoa(int(key))
}
