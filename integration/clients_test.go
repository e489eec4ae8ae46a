package integration

// Helpers that drive real third-party Kafka clients as subprocesses: kcat
// (librdkafka), Kafka's own Java console tools (kafka-tools) and Python
// confluent-kafka (testdata/py/kclient.py). scripts/clients installs them
// and exports where they are:
//
//	FERRY_KCAT            the kcat binary (else kcat on PATH)
//	FERRY_PYTHON          a python with confluent_kafka (the venv's)
//	FERRY_KAFKA_TOOLS_CP  the folder of kafka-tools jars (java -cp 'DIR/*')
//
// A missing client skips its test, or fails it when CI is set. Every run
// has a deadline, and a failure shows the client's stderr.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// clientTimeout bounds one client run (JVM start-up included). Generous: at
// load average 87 a kafka-reassign-partitions --verify had printed its
// answer and still not exited after 90 s.
const clientTimeout = 5 * time.Minute

// clientRecord is a record as a third-party client produced or consumed it.
type clientRecord struct {
	Partition int32
	Offset    int64
	Key       []byte // nil: no key
	Value     []byte
	Headers   []clientHeader
}

type clientHeader struct {
	Key   string
	Value []byte
}

func (r clientRecord) String() string {
	return fmt.Sprintf("p%d@%d key=%q value=%q headers=%q", r.Partition, r.Offset, r.Key, r.Value, r.Headers)
}

// missingClient skips the test, or fails it under CI, where every client
// must be there.
func missingClient(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...) + " (scripts/clients installs it; scripts/test runs it)"
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

func kcatPath(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("FERRY_KCAT"); p != "" {
		return p
	}
	p, err := exec.LookPath("kcat")
	if err != nil {
		missingClient(t, "kcat not found: FERRY_KCAT is unset and no kcat is on PATH")
	}
	return p
}

func pythonPath(t testing.TB) string {
	t.Helper()
	p := os.Getenv("FERRY_PYTHON")
	if p == "" {
		missingClient(t, "FERRY_PYTHON (a python with confluent-kafka) is unset")
	}
	return p
}

func kafkaToolsCP(t testing.TB) string {
	t.Helper()
	d := os.Getenv("FERRY_KAFKA_TOOLS_CP")
	if d == "" {
		missingClient(t, "FERRY_KAFKA_TOOLS_CP (the kafka-tools jar folder) is unset")
	}
	if _, err := os.Stat(d); err != nil {
		missingClient(t, "FERRY_KAFKA_TOOLS_CP: %v", err)
	}
	return d
}

// runClient runs name with args and stdin, and returns its stdout; a non-zero
// exit or the deadline fails the test with the client's stderr.
func runClient(t testing.TB, stdin []byte, name string, args ...string) []byte {
	t.Helper()
	out, errOut, err := runClientErr(stdin, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\nstderr:\n%s\nstdout:\n%s", filepath.Base(name), strings.Join(args, " "), err, tail(errOut), tail(out))
	}
	return out
}

func runClientErr(stdin []byte, name string, args ...string) (stdout, stderr []byte, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), clientTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.WaitDelay = 5 * time.Second
	cmd.Stdin = bytes.NewReader(stdin)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("no exit within %v: %w", clientTimeout, err)
	}
	return o.Bytes(), e.Bytes(), err
}

// tail keeps the last 4 KiB of a client's output for a failure message.
func tail(b []byte) string {
	const n = 4 << 10
	if len(b) > n {
		return "..." + string(b[len(b)-n:])
	}
	return string(b)
}

// ---------------------------------------------------------------- kcat

// kcatProduce produces recs to topic with kcat (-P): one line per record,
// key and value split by a tab, so keys and values must hold neither '\t'
// nor '\n' (any other bytes are fine); every record gets headers (kcat -H
// applies to all). args adds kcat flags such as -z zstd or -X name=value.
func kcatProduce(t testing.TB, bootstrap, topic string, recs []clientRecord, headers []clientHeader, args ...string) {
	t.Helper()
	var in bytes.Buffer
	for _, r := range recs {
		if r.Key == nil || bytes.ContainsAny(r.Key, "\t\n") || bytes.ContainsAny(r.Value, "\t\n") {
			t.Fatalf("kcatProduce: record %v needs a key and no tab or newline", r)
		}
		in.Write(r.Key)
		in.WriteByte('\t')
		in.Write(r.Value)
		in.WriteByte('\n')
	}
	a := []string{"-P", "-b", bootstrap, "-t", topic, "-K", "\t", "-c", strconv.Itoa(len(recs))}
	for _, h := range headers {
		a = append(a, "-H", h.Key+"="+string(h.Value))
	}
	runClient(t, in.Bytes(), kcatPath(t), append(a, args...)...)
}

// kcatFormat makes kcat print each record with its key and value lengths,
// so binary keys and values parse exactly; header values must hold neither
// ',' nor '\n'.
const kcatFormat = `P%p O%o K%K S%S %k%s H%h\n`

// kcatConsume reads topic from the beginning to the end of every partition
// with kcat (-C -e); args adds flags such as -X isolation.level=read_committed.
func kcatConsume(t testing.TB, bootstrap, topic string, args ...string) []clientRecord {
	t.Helper()
	a := []string{"-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-e", "-q", "-f", kcatFormat}
	out := runClient(t, nil, kcatPath(t), append(a, args...)...)
	recs, err := parseKcat(out)
	if err != nil {
		t.Fatalf("kcat output: %v\n%s", err, tail(out))
	}
	return recs
}

// parseKcat reads the records kcatFormat prints.
func parseKcat(out []byte) ([]clientRecord, error) {
	var recs []clientRecord
	for len(out) > 0 {
		var r clientRecord
		var klen, vlen int
		// The four numeric fields, each followed by one space.
		fields := make([]string, 4)
		for i := range fields {
			sp := bytes.IndexByte(out, ' ')
			if sp < 0 {
				return nil, fmt.Errorf("record %d: truncated header fields", len(recs))
			}
			fields[i], out = string(out[:sp]), out[sp+1:]
		}
		var err error
		var p int64
		if p, err = strconv.ParseInt(strings.TrimPrefix(fields[0], "P"), 10, 32); err == nil {
			r.Partition = int32(p)
			if r.Offset, err = strconv.ParseInt(strings.TrimPrefix(fields[1], "O"), 10, 64); err == nil {
				if klen, err = strconv.Atoi(strings.TrimPrefix(fields[2], "K")); err == nil {
					vlen, err = strconv.Atoi(strings.TrimPrefix(fields[3], "S"))
				}
			}
		}
		if err != nil {
			return nil, fmt.Errorf("record %d: fields %q: %v", len(recs), fields, err)
		}
		// kcat prints -1 for a null key or value.
		if klen >= 0 {
			if len(out) < klen {
				return nil, fmt.Errorf("record %d: key shorter than %d", len(recs), klen)
			}
			r.Key, out = bytes.Clone(out[:klen]), out[klen:]
		}
		if vlen >= 0 {
			if len(out) < vlen {
				return nil, fmt.Errorf("record %d: value shorter than %d", len(recs), vlen)
			}
			r.Value, out = bytes.Clone(out[:vlen]), out[vlen:]
		}
		if !bytes.HasPrefix(out, []byte(" H")) {
			return nil, fmt.Errorf("record %d: no headers field after the value", len(recs))
		}
		out = out[2:]
		nl := bytes.IndexByte(out, '\n')
		if nl < 0 {
			return nil, fmt.Errorf("record %d: no line end", len(recs))
		}
		if hs := string(out[:nl]); hs != "" {
			for _, kv := range strings.Split(hs, ",") {
				k, v, _ := strings.Cut(kv, "=")
				r.Headers = append(r.Headers, clientHeader{Key: k, Value: []byte(v)})
			}
		}
		out = out[nl+1:]
		recs = append(recs, r)
	}
	return recs, nil
}

// ---------------------------------------------------------------- Java

// javaTool runs one of Kafka's Java command-line tools (main class of
// kafka-tools) with a small, quickly starting JVM.
func javaTool(t testing.TB, stdin []byte, main string, args ...string) []byte {
	t.Helper()
	return runClient(t, stdin, "java", javaArgs(t, main, args...)...)
}

func javaArgs(t testing.TB, main string, args ...string) []string {
	t.Helper()
	cp := kafkaToolsCP(t)
	log4j, err := filepath.Abs(filepath.Join("..", "scripts", "kafka-tools", "log4j2.xml"))
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{
		"-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Djava.awt.headless=true",
		"-Dlog4j2.configurationFile=" + log4j,
		"-cp", filepath.Join(cp, "*"), main,
	}, args...)
}

const (
	javaConsoleProducer     = "org.apache.kafka.tools.ConsoleProducer"
	javaConsoleConsumer     = "org.apache.kafka.tools.consumer.ConsoleConsumer"
	javaProducerPerformance = "org.apache.kafka.tools.ProducerPerformance"
	javaBrokerAPIVersions   = "org.apache.kafka.tools.BrokerApiVersionsCommand"
	javaTopicCommand        = "org.apache.kafka.tools.TopicCommand"
)

// javaBrokerAPIVersionsRun runs kafka-broker-api-versions against bootstrap
// with props (client properties, "key=value") in its --command-config and
// returns its output. Its admin client's request.timeout.ms defaults to
// 5 s, which a loaded machine's JVM can spend on the TLS handshake alone
// (the METADATA request failed after 90 s of retries at load average 60):
// it is raised to 60 s here.
func javaBrokerAPIVersionsRun(t *testing.T, bootstrap string, props ...string) []byte {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "broker-api-versions.properties")
	props = append(props, "request.timeout.ms=60000")
	if err := os.WriteFile(cfg, []byte(strings.Join(props, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return javaTool(t, nil, javaBrokerAPIVersions, "--bootstrap-server", bootstrap, "--command-config", cfg)
}

// javaProduce produces recs with Kafka's console producer, one line each:
// "h1:v1,h2:v2<TAB>key<TAB>value". Keys, values and headers must hold no
// newline or tab, header keys and values no ',' or ':', and every record
// needs a key and at least one header. args adds tool flags such as
// --compression-codec zstd or --command-property name=value.
func javaProduce(t testing.TB, bootstrap, topic string, recs []clientRecord, args ...string) {
	t.Helper()
	var in bytes.Buffer
	for _, r := range recs {
		if r.Key == nil || len(r.Headers) == 0 || bytes.ContainsAny(r.Key, "\t\n") || bytes.ContainsAny(r.Value, "\t\n") {
			t.Fatalf("javaProduce: record %v needs a key, a header, and no tab or newline", r)
		}
		for i, h := range r.Headers {
			if strings.ContainsAny(h.Key, ",:\t\n") || bytes.ContainsAny(h.Value, ",:\t\n") {
				t.Fatalf("javaProduce: header %q of %v", h, r)
			}
			if i > 0 {
				in.WriteByte(',')
			}
			in.WriteString(h.Key)
			in.WriteByte(':')
			in.Write(h.Value)
		}
		in.WriteByte('\t')
		in.Write(r.Key)
		in.WriteByte('\t')
		in.Write(r.Value)
		in.WriteByte('\n')
	}
	a := []string{
		"--bootstrap-server", bootstrap, "--topic", topic, "--timeout", "10", // linger.ms
		"--reader-property", "parse.key=true", "--reader-property", "parse.headers=true",
	}
	javaTool(t, in.Bytes(), javaConsoleProducer, append(a, args...)...)
}

// javaConsumerArgs are the console consumer's flags that print partition,
// offset, headers, key and value, tab-separated (parseJavaConsole reads them).
var javaConsumerArgs = []string{
	"--formatter-property", "print.partition=true",
	"--formatter-property", "print.offset=true",
	"--formatter-property", "print.headers=true",
	"--formatter-property", "print.key=true",
}

// javaConsume reads topic from the beginning with Kafka's console consumer:
// n records when n > 0 (fewer fail the test), or, with n == 0, whatever comes
// until no record arrived for 5 s. args adds flags such as --isolation-level.
func javaConsume(t testing.TB, bootstrap, topic string, n int, args ...string) []clientRecord {
	t.Helper()
	a := append([]string{"--bootstrap-server", bootstrap, "--topic", topic, "--from-beginning"}, javaConsumerArgs...)
	if n > 0 {
		a = append(a, "--max-messages", strconv.Itoa(n), "--timeout-ms", "60000")
	} else {
		a = append(a, "--timeout-ms", "5000")
	}
	out, errOut, err := runClientErr(nil, "java", javaArgs(t, javaConsoleConsumer, append(a, args...)...)...)
	// With n == 0 the consumer ends on its idle timeout, which it reports as
	// an error but exits 0 from.
	if err != nil {
		t.Fatalf("console consumer: %v\nstderr:\n%s", err, tail(errOut))
	}
	recs, perr := parseJavaConsole(out)
	if perr != nil {
		t.Fatalf("console consumer output: %v\n%s", perr, tail(out))
	}
	if n > 0 && len(recs) != n {
		t.Fatalf("console consumer read %d records, want %d\nstderr:\n%s", len(recs), n, tail(errOut))
	}
	return recs
}

// parseJavaConsole reads the console consumer's lines
// "Partition:P<TAB>Offset:O<TAB>h1:v1,h2:v2|NO_HEADERS<TAB>key|null<TAB>value".
func parseJavaConsole(out []byte) ([]clientRecord, error) {
	var recs []clientRecord
	for line := range strings.Lines(string(out)) {
		line = strings.TrimSuffix(line, "\n")
		f := strings.SplitN(line, "\t", 5)
		if len(f) != 5 || !strings.HasPrefix(f[0], "Partition:") || !strings.HasPrefix(f[1], "Offset:") {
			return nil, fmt.Errorf("line %q", line)
		}
		p, err1 := strconv.ParseInt(strings.TrimPrefix(f[0], "Partition:"), 10, 32)
		o, err2 := strconv.ParseInt(strings.TrimPrefix(f[1], "Offset:"), 10, 64)
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("line %q: %v", line, err)
		}
		r := clientRecord{Partition: int32(p), Offset: o, Value: []byte(f[4])}
		if f[3] != "null" {
			r.Key = []byte(f[3])
		}
		if f[2] != "NO_HEADERS" {
			for _, kv := range strings.Split(f[2], ",") {
				k, v, _ := strings.Cut(kv, ":")
				r.Headers = append(r.Headers, clientHeader{Key: k, Value: []byte(v)})
			}
		}
		recs = append(recs, r)
	}
	return recs, nil
}

// javaPerf produces n records of size bytes each to topic with Kafka's
// producer performance tool (kafka-producer-perf-test), unthrottled; props
// are extra producer properties (name=value). It returns the tool's output.
func javaPerf(t testing.TB, bootstrap, topic string, n, size int, props ...string) []byte {
	t.Helper()
	a := []string{
		"--topic", topic, "--num-records", strconv.Itoa(n), "--record-size", strconv.Itoa(size),
		"--throughput", "-1",
		// One flag with every property: a repeated flag replaces the previous.
		"--command-property", "bootstrap.servers=" + bootstrap,
	}
	return javaTool(t, nil, javaProducerPerformance, append(a, props...)...)
}

// ---------------------------------------------------------------- Python

// pyRecord is a record as testdata/py/kclient.py reads and prints it.
type pyRecord struct {
	Event     string       `json:"event,omitempty"`
	Partition int32        `json:"partition"`
	Offset    int64        `json:"offset"`
	Key       *string      `json:"key"`
	Value     *string      `json:"value"`
	Headers   [][2]*string `json:"headers"`
}

func toPy(r clientRecord) pyRecord {
	b64 := func(b []byte) *string {
		if b == nil {
			return nil
		}
		s := base64.StdEncoding.EncodeToString(b)
		return &s
	}
	p := pyRecord{Key: b64(r.Key), Value: b64(r.Value), Headers: [][2]*string{}}
	for _, h := range r.Headers {
		k := h.Key
		p.Headers = append(p.Headers, [2]*string{&k, b64(h.Value)})
	}
	return p
}

func (p pyRecord) record() (clientRecord, error) {
	unb64 := func(s *string) ([]byte, error) {
		if s == nil {
			return nil, nil
		}
		return base64.StdEncoding.DecodeString(*s)
	}
	r := clientRecord{Partition: p.Partition, Offset: p.Offset}
	var err error
	if r.Key, err = unb64(p.Key); err != nil {
		return r, err
	}
	if r.Value, err = unb64(p.Value); err != nil {
		return r, err
	}
	for _, h := range p.Headers {
		if h[0] == nil {
			return r, errors.New("header without a key")
		}
		v, err := unb64(h[1])
		if err != nil {
			return r, err
		}
		r.Headers = append(r.Headers, clientHeader{Key: *h[0], Value: v})
	}
	return r, nil
}

// pyArgs builds a kclient.py command line: props are client properties
// (name=value), cmd the subcommand and its arguments. python -B writes no
// __pycache__ into the source tree.
func pyArgs(bootstrap string, props []string, cmd ...string) []string {
	a := []string{"-B", filepath.Join("testdata", "py", "kclient.py"), "--bootstrap", bootstrap}
	for _, p := range props {
		a = append(a, "-X", p)
	}
	return append(a, cmd...)
}

func pyRun(t testing.TB, stdin []byte, bootstrap string, props []string, cmd ...string) []byte {
	t.Helper()
	return runClient(t, stdin, pythonPath(t), pyArgs(bootstrap, props, cmd...)...)
}

func jsonLines[T any](t testing.TB, out []byte) []T {
	t.Helper()
	var vs []T
	for line := range bytes.Lines(out) {
		var v T
		if err := json.Unmarshal(line, &v); err != nil {
			t.Fatalf("client output line %q: %v", line, err)
		}
		vs = append(vs, v)
	}
	return vs
}

func pyRecordsJSON(t testing.TB, recs []clientRecord) []byte {
	t.Helper()
	var in bytes.Buffer
	enc := json.NewEncoder(&in)
	for _, r := range recs {
		if err := enc.Encode(toPy(r)); err != nil {
			t.Fatal(err)
		}
	}
	return in.Bytes()
}

// pyProduce produces recs (any bytes) with confluent-kafka; props are
// producer properties such as compression.type=zstd.
func pyProduce(t testing.TB, bootstrap, topic string, recs []clientRecord, props ...string) {
	t.Helper()
	out := pyRun(t, pyRecordsJSON(t, recs), bootstrap, props, "produce", topic)
	if got := len(jsonLines[pyRecord](t, out)); got != len(recs) {
		t.Fatalf("python produced %d records, want %d", got, len(recs))
	}
}

// pyTxn is one transaction for pyTxnProduce: its records, then commit or abort.
type pyTxn struct {
	Records []clientRecord
	Commit  bool
}

// pyTxnProduce runs the transactions in order with one transactional
// confluent-kafka producer (transactional.id txnID).
func pyTxnProduce(t testing.TB, bootstrap, topic, txnID string, txns []pyTxn) {
	t.Helper()
	var in bytes.Buffer
	for _, tx := range txns {
		end := "abort"
		if tx.Commit {
			end = "commit"
		}
		recs := make([]pyRecord, 0, len(tx.Records))
		for _, r := range tx.Records {
			recs = append(recs, toPy(r))
		}
		b, err := json.Marshal(map[string]any{"end": end, "records": recs})
		if err != nil {
			t.Fatal(err)
		}
		in.Write(b)
		in.WriteByte('\n')
	}
	out := pyRun(t, in.Bytes(), bootstrap, []string{"transactional.id=" + txnID}, "txn-produce", topic)
	if got := len(jsonLines[map[string]any](t, out)); got != len(txns) {
		t.Fatalf("python ended %d transactions, want %d", got, len(txns))
	}
}

// pyConsume reads every partition of topic from the beginning to its end
// with confluent-kafka; props such as isolation.level=read_committed.
func pyConsume(t testing.TB, bootstrap, topic string, props ...string) []clientRecord {
	t.Helper()
	out := pyRun(t, nil, bootstrap, props, "consume", topic)
	var recs []clientRecord
	for _, p := range jsonLines[pyRecord](t, out) {
		r, err := p.record()
		if err != nil {
			t.Fatalf("python record %+v: %v", p, err)
		}
		recs = append(recs, r)
	}
	return recs
}

// ---------------------------------------------------------------- group members

// groupMember is a long-running consumer group member (a subprocess) whose
// stdout lines are collected as they come. Stop ends it.
type groupMember struct {
	name   string
	cmd    *exec.Cmd
	cancel context.CancelFunc
	stdin  interface{ Close() error }
	stderr bytes.Buffer
	done   chan struct{}
	// stdinStops: closing stdin makes the member leave and exit (Python);
	// otherwise stop interrupts it (the Java console consumer closes its
	// consumer on SIGINT).
	stdinStops bool

	mu    sync.Mutex
	lines []string
}

// startMember starts name args as a group member; it is stopped at cleanup
// at the latest.
func startMember(t testing.TB, label string, stdinStops bool, name string, args ...string) *groupMember {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*clientTimeout)
	m := &groupMember{name: label, cancel: cancel, done: make(chan struct{}), stdinStops: stdinStops}
	m.cmd = exec.CommandContext(ctx, name, args...)
	m.cmd.WaitDelay = 10 * time.Second
	m.cmd.Cancel = func() error { return m.cmd.Process.Signal(os.Interrupt) }
	m.cmd.Stderr = &m.stderr
	in, err := m.cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	m.stdin = in
	out, err := m.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := m.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", label, err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			m.mu.Lock()
			m.lines = append(m.lines, sc.Text())
			m.mu.Unlock()
		}
		_ = m.cmd.Wait()
		close(m.done)
	}()
	t.Cleanup(func() { m.stop(); cancel() })
	return m
}

// Lines returns what the member printed so far.
func (m *groupMember) Lines() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.lines)
}

// stop ends the member (see stdinStops) and waits for it; a member that
// does not leave on stdin's close within 15 s is interrupted too.
func (m *groupMember) stop() {
	m.stdin.Close()
	if m.stdinStops {
		select {
		case <-m.done:
			return
		case <-time.After(15 * time.Second):
		}
	}
	m.cancel()
	<-m.done
}

// Stderr returns the member's stderr (for failure messages).
func (m *groupMember) Stderr() string { return tail(m.stderr.Bytes()) }

// waitFor polls cond every 200 ms until it is true or d passes; then it
// fails the test with msg() (called only then).
func waitFor(t testing.TB, d time.Duration, cond func() bool, msg func() string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", d, msg())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// ---------------------------------------------------------------- checks

// clientTopic creates a topic with partitions on the real broker (franz-go,
// direct) and returns its name.
func clientTopic(t testing.TB, partitions int32, configs map[string]*string) string {
	t.Helper()
	name := fmt.Sprintf("ferry-cl-%s-%d-%d", strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name())), time.Now().UnixNano()%1e6, topicSeq.Add(1))
	if len(name) > 200 {
		name = name[:200]
	}
	resp, err := kadm.NewClient(client(t)).CreateTopic(ctxT(t, 30*time.Second), partitions, 1, configs, name)
	if err != nil || resp.Err != nil {
		t.Fatalf("create topic %s: %v %v", name, err, resp.Err)
	}
	return name
}

// viaClient is a franz-go client that talks to via (viaProxy's address).
func viaClient(t testing.TB, via string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(strings.Split(via, ",")...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// pollN reads n records of topic from the start with cl's consume options
// set by the caller (kgo.ConsumeTopics etc.).
func pollN(t testing.TB, cl *kgo.Client, n int) []*kgo.Record {
	t.Helper()
	ctx := ctxT(t, 60*time.Second)
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of %d records: %v", len(out), n, err)
		}
		fs.EachError(func(tp string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", tp, p, err) })
		out = append(out, fs.Records()...)
	}
	return out
}

// fromKgo turns franz-go records into clientRecords.
func fromKgo(rs []*kgo.Record) []clientRecord {
	out := make([]clientRecord, 0, len(rs))
	for _, r := range rs {
		c := clientRecord{Partition: r.Partition, Offset: r.Offset, Key: r.Key, Value: r.Value}
		for _, h := range r.Headers {
			c.Headers = append(c.Headers, clientHeader{Key: h.Key, Value: h.Value})
		}
		out = append(out, c)
	}
	return out
}

// sameRecords checks that got holds exactly want's records (key, value and
// headers byte for byte, each once), in any order across partitions but in
// produce order within a key, and that offsets grow within a partition.
func sameRecords(t testing.TB, label string, got, want []clientRecord) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d records, want %d\ngot:  %v\nwant: %v", label, len(got), len(want), got, want)
	}
	byKey := func(rs []clientRecord) map[string][]clientRecord {
		m := map[string][]clientRecord{}
		for _, r := range rs {
			k := "v:" + string(r.Value)
			if r.Key != nil {
				k = "k:" + string(r.Key)
			}
			m[k] = append(m[k], r)
		}
		return m
	}
	g, w := byKey(got), byKey(want)
	for k, ws := range w {
		gs := g[k]
		if len(gs) != len(ws) {
			t.Fatalf("%s: %d records with %q, want %d", label, len(gs), k, len(ws))
		}
		for i := range ws {
			if !bytes.Equal(gs[i].Key, ws[i].Key) || (gs[i].Key == nil) != (ws[i].Key == nil) {
				t.Fatalf("%s: key %q, want %q", label, gs[i].Key, ws[i].Key)
			}
			if !bytes.Equal(gs[i].Value, ws[i].Value) {
				t.Fatalf("%s: record %q value %q, want %q", label, k, gs[i].Value, ws[i].Value)
			}
			if len(gs[i].Headers) != len(ws[i].Headers) {
				t.Fatalf("%s: record %q headers %q, want %q", label, k, gs[i].Headers, ws[i].Headers)
			}
			for j, h := range ws[i].Headers {
				if gs[i].Headers[j].Key != h.Key || !bytes.Equal(gs[i].Headers[j].Value, h.Value) {
					t.Fatalf("%s: record %q headers %q, want %q", label, k, gs[i].Headers, ws[i].Headers)
				}
			}
		}
	}
	last := map[int32]int64{}
	for _, r := range got {
		if o, ok := last[r.Partition]; ok && r.Offset <= o {
			t.Fatalf("%s: partition %d offset %d after %d", label, r.Partition, r.Offset, o)
		}
		last[r.Partition] = r.Offset
	}
}

// noRealBrokerPort fails the test if a client's output (metadata it
// printed) names the real broker's port as a number of its own, while the
// client went through a proxy (via, viaProxy's address, differs from
// brokers). With viaProxy still the broker itself there is nothing to hide
// and it checks nothing; callers check the output's content themselves.
func noRealBrokerPort(t testing.TB, via, what string, output []byte) {
	t.Helper()
	real := brokers(t)
	if via == real {
		return
	}
	for _, addr := range strings.Split(real, ",") {
		_, port, _ := strings.Cut(addr, ":")
		if regexp.MustCompile(`\b` + regexp.QuoteMeta(port) + `\b`).Match(output) {
			t.Fatalf("%s: output names the real broker port %s:\n%s", what, port, tail(output))
		}
	}
}
