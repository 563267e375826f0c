// Package common is what the Go benchmark workers share with bench/clients/_worker.py: the
// same arguments, the same clocks (getrusage for this process, /proc for the cluster and
// the machine) and the same JSON result line, so bench/compare reads them as any worker.
package common

import (
	"encoding/json"
	"flag"
	"fmt"
	"io/ioutil"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Body is the 100-byte body every benchmark publishes.
var Body = []byte(strings.Repeat("x", 100))

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// Args are _worker.py's arguments (those a Go worker uses; the others are accepted).
type Args struct {
	Workload    string
	Nsqd        []string
	Lookupd     []string
	Topic       string
	Channel     string
	Messages    int
	Warmup      int
	Concurrency int
	Batch       int
	MpubWindow  int
	MaxInFlight int
	Ordered     bool
	ClusterPid  int
	Timeout     float64
}

// Parse reads the workload (first argument) and the flags after it.
func Parse(client string, workloads []string) *Args {
	if len(os.Args) < 2 {
		Fail("usage: %s WORKLOAD [flags]", client)
	}
	a := &Args{Workload: os.Args[1]}
	known := false
	for _, w := range workloads {
		known = known || w == a.Workload
	}
	if !known {
		Fail("%s: unknown workload %q (known: %v)", client, a.Workload, workloads)
	}
	fs := flag.NewFlagSet(client, flag.ExitOnError)
	var nsqd, lookupd listFlag
	fs.Var(&nsqd, "nsqd", "nsqd TCP address (repeatable)")
	fs.Var(&lookupd, "lookupd", "nsqlookupd HTTP URL (repeatable)")
	fs.StringVar(&a.Topic, "topic", "", "topic")
	fs.StringVar(&a.Channel, "channel", "bench", "channel")
	fs.IntVar(&a.Messages, "messages", 0, "measured messages")
	fs.IntVar(&a.Warmup, "warmup", 1000, "publish: unmeasured first")
	fs.IntVar(&a.Concurrency, "concurrency", 100, "pub100: publishers")
	fs.IntVar(&a.Batch, "batch", 100, "mpub100: messages per MPUB")
	fs.IntVar(&a.MpubWindow, "mpub-window", 1, "mpub100: MPUBs in flight")
	fs.IntVar(&a.MaxInFlight, "max-in-flight", 2500, "consume")
	fs.BoolVar(&a.Ordered, "ordered", false, "consume: ordered (youzan)")
	fs.IntVar(&a.ClusterPid, "cluster-pid", 0, "read this process's CPU too")
	fs.Float64Var(&a.Timeout, "timeout", 300, "give up after (s)")
	// accepted for the Python workers' sake; pinning is the orchestrator's (inherited)
	fs.Int("cpu", -1, "ignored: the orchestrator pins the process")
	fs.Parse(os.Args[2:])
	a.Nsqd, a.Lookupd = nsqd, lookupd
	if a.Messages < 1 || a.Topic == "" || (len(a.Nsqd) == 0 && len(a.Lookupd) == 0) {
		Fail("%s: --messages, --topic and --nsqd or --lookupd are required", client)
	}
	return a
}

// Fail prints to stderr and exits with status 2.
func Fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(2)
}

// Result is _worker.py's Result.
type Result struct {
	Client     string                 `json:"client"`
	Version    string                 `json:"version"`
	Workload   string                 `json:"workload"`
	Messages   int                    `json:"messages"`
	Seconds    float64                `json:"seconds"`
	CPU        float64                `json:"cpu"`
	CPUSystem  float64                `json:"cpu_system"`
	ClusterCPU *float64               `json:"cluster_cpu"`
	OtherCPU   *float64               `json:"other_cpu"`
	LatencyUs  map[string]float64     `json:"latency_us"`
	Cpus       map[string][]int       `json:"cpus"`
	Extra      map[string]interface{} `json:"extra"`
}

var clkTck = 100.0 // USER_HZ: 100 on Linux

func cpuSplit() (float64, float64) {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime), tv(ru.Stime)
}

func procCPU(pid int) (float64, bool) {
	data, err := ioutil.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	text := string(data)
	fields := strings.Fields(text[strings.LastIndex(text, ")")+2:])
	user, _ := strconv.Atoi(fields[11])
	system, _ := strconv.Atoi(fields[12])
	return float64(user+system) / clkTck, true
}

func machineBusy() float64 {
	data, err := ioutil.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	fields := strings.Fields(strings.SplitN(string(data), "\n", 2)[0])
	total := 0
	for i, f := range fields[1:9] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		v, _ := strconv.Atoi(f)
		total += v
	}
	return float64(total) / clkTck
}

// Meter is _worker.py's Meter: wall time, this process's CPU, the cluster's, the machine's.
type Meter struct {
	pid                   int
	t0                    time.Time
	user0, system0, busy0 float64
	cluster0              float64
	hasCluster            bool
	seconds, cpu, cpuSys  float64
	clusterCPU, otherCPU  *float64
}

// NewMeter measures the cluster process “pid“ too (0: none).
func NewMeter(pid int) *Meter { return &Meter{pid: pid} }

// Start begins the measured phase.
func (m *Meter) Start() {
	m.busy0 = machineBusy()
	if m.pid > 0 {
		m.cluster0, m.hasCluster = procCPU(m.pid)
	}
	m.user0, m.system0 = cpuSplit()
	m.t0 = time.Now()
}

// Stop ends it.
func (m *Meter) Stop() {
	seconds := time.Since(m.t0).Seconds()
	user, system := cpuSplit()
	var cluster float64
	ok := false
	if m.pid > 0 {
		cluster, ok = procCPU(m.pid)
	}
	busy := machineBusy() - m.busy0
	m.seconds = seconds
	m.cpuSys = system - m.system0
	m.cpu = user - m.user0 + m.cpuSys
	if ok && m.hasCluster {
		c := cluster - m.cluster0
		o := busy - m.cpu - c
		if o < 0 {
			o = 0
		}
		m.clusterCPU, m.otherCPU = &c, &o
	}
}

// Fill writes the measured phase into “r“.
func (m *Meter) Fill(r *Result, messages int) {
	r.Messages = messages
	r.Seconds = m.seconds
	r.CPU = m.cpu
	r.CPUSystem = m.cpuSys
	r.ClusterCPU = m.clusterCPU
	r.OtherCPU = m.otherCPU
	r.Cpus = map[string][]int{"client": affinity("self")}
	if m.pid > 0 {
		r.Cpus["cluster"] = affinity(strconv.Itoa(m.pid))
	}
}

// affinity reads Cpus_allowed_list of /proc/<pid>/status ("0-1,3").
func affinity(pid string) []int {
	data, err := ioutil.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return nil
	}
	for _, line := range strings.Split(string(data), "\n") {
		if !strings.HasPrefix(line, "Cpus_allowed_list:") {
			continue
		}
		cpus := []int{}
		for _, part := range strings.Split(strings.TrimSpace(line[len("Cpus_allowed_list:"):]), ",") {
			bounds := strings.SplitN(part, "-", 2)
			low, _ := strconv.Atoi(bounds[0])
			high := low
			if len(bounds) == 2 {
				high, _ = strconv.Atoi(bounds[1])
			}
			for c := low; c <= high; c++ {
				cpus = append(cpus, c)
			}
		}
		return cpus
	}
	return nil
}

// Percentiles is _worker.py's percentiles: nanoseconds in, microseconds out.
func Percentiles(samples []int64) map[string]float64 {
	out := map[string]float64{}
	if len(samples) == 0 {
		return out
	}
	sorted := append([]int64(nil), samples...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	last := len(sorted) - 1
	at := func(q float64) float64 {
		i := int(q*float64(last) + 0.5)
		if i > last {
			i = last
		}
		return float64(sorted[i]) / 1000
	}
	var sum int64
	for _, s := range sorted {
		sum += s
	}
	out["p50"], out["p90"], out["p99"] = at(0.5), at(0.9), at(0.99)
	out["max"] = float64(sorted[last]) / 1000
	out["mean"] = float64(sum) / float64(len(sorted)) / 1000
	return out
}

// Emit prints the result as the last line of stdout.
func Emit(r *Result) {
	if r.LatencyUs == nil {
		r.LatencyUs = map[string]float64{}
	}
	data, err := json.Marshal(r)
	if err != nil {
		Fail("result: %v", err)
	}
	os.Stdout.Write(append(data, '\n'))
}

// Sequential runs “count“ calls of “publish“ one after the other; each one's latency.
func Sequential(publish func() error, count int, latencies *[]int64) {
	for i := 0; i < count; i++ {
		t0 := time.Now()
		if err := publish(); err != nil {
			Fail("publish: %v", err)
		}
		*latencies = append(*latencies, int64(time.Since(t0)))
	}
}

// Concurrent runs “count“ calls of “publish“ from “workers“ goroutines.
func Concurrent(publish func() error, count, workers int) {
	jobs := make(chan struct{}, count)
	for i := 0; i < count; i++ {
		jobs <- struct{}{}
	}
	close(jobs)
	done := make(chan error, workers)
	for w := 0; w < workers; w++ {
		go func() {
			for range jobs {
				if err := publish(); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	for w := 0; w < workers; w++ {
		if err := <-done; err != nil {
			Fail("publish: %v", err)
		}
	}
}

// Publish warms up, then measures “args.Messages“ messages of the publish workload.
func Publish(args *Args, r *Result, pub func() error, mpub func() error) {
	var latencies []int64
	run := func(messages int) {
		switch args.Workload {
		case "pub1":
			Sequential(pub, messages, &latencies)
		case "pub100":
			Concurrent(pub, messages, args.Concurrency)
		case "mpub100":
			batches := messages / args.Batch
			if batches < 1 {
				batches = 1
			}
			Concurrent(mpub, batches, args.MpubWindow)
		}
	}
	run(args.Warmup)
	latencies = latencies[:0]
	m := NewMeter(args.ClusterPid)
	m.Start()
	run(args.Messages)
	m.Stop()
	m.Fill(r, args.Messages)
	r.LatencyUs = Percentiles(latencies)
}

// Batch is “args.Batch“ bodies.
func Batch(args *Args) [][]byte {
	batch := make([][]byte, args.Batch)
	for i := range batch {
		batch[i] = Body
	}
	return batch
}

// Deadline fails the worker once “args.Timeout“ passes.
func Deadline(args *Args) {
	go func() {
		time.Sleep(time.Duration(args.Timeout * float64(time.Second)))
		Fail("no result after %g s", args.Timeout)
	}()
}
