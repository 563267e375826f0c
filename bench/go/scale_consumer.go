// scale_consumer: youzan's go-nsq beside bench/clients/scale_worker.py, with the same phases,
// stdin/stdout exchange and JSON keys (see bench/scale.py). One Consumer per topic, each
// subscribed to every partition its lookup lists.
//
// Built in GOPATH mode against a GOPATH that holds github.com/youzan/go-nsq and its
// dependencies (bench/scale.py --gopath); the library is not part of this repository.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	nsq "github.com/youzan/go-nsq"
)

func cpuSeconds() float64 {
	var usage syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &usage)
	return float64(usage.Utime.Nano()+usage.Stime.Nano()) / 1e9
}

func procCPU(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	text := string(data)
	fields := strings.Fields(text[strings.LastIndex(text, ")")+2:])
	user, _ := strconv.ParseFloat(fields[11], 64)
	system, _ := strconv.ParseFloat(fields[12], 64)
	return (user + system) / 100 // CLK_TCK
}

// rss is the resident set after a collection whose garbage is handed back to the OS.
func rss() int64 {
	runtime.GC()
	debug.FreeOSMemory()
	data, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	pages, _ := strconv.ParseInt(strings.Fields(string(data))[1], 10, 64)
	return pages * int64(os.Getpagesize())
}

// inUse is what the Go runtime holds for live objects and goroutine stacks.
func inUse() int64 {
	runtime.GC()
	var stats runtime.MemStats
	runtime.ReadMemStats(&stats)
	return int64(stats.HeapInuse + stats.StackInuse)
}

type counter struct {
	received int64
	target   int64
	done     chan struct{}
}

func (c *counter) HandleMessage(m *nsq.Message) error {
	if atomic.AddInt64(&c.received, 1) == atomic.LoadInt64(&c.target) {
		close(c.done)
	}
	return nil
}

func main() {
	lookupd := flag.String("lookupd", "", "nsqlookupd HTTP address")
	topics := flag.String("topics", "", "comma-separated topics")
	channel := flag.String("channel", "scale", "channel")
	maxInFlight := flag.Int("max-in-flight", 2500, "split over topics")
	heartbeat := flag.Float64("heartbeat-interval", 30, "s")
	settle := flag.Float64("settle", 1, "s before measuring memory")
	idle := flag.Float64("idle", 0, "s of idle CPU measured")
	messages := flag.Int64("messages", 0, "traffic phase: messages")
	expected := flag.Int("connections", 0, "partitions to wait for")
	clusterPID := flag.Int("cluster-pid", 0, "read this process's CPU too")
	timeout := flag.Float64("timeout", 120, "s")
	flag.Parse()

	names := strings.Split(*topics, ",")
	budget := (*maxInFlight + len(names) - 1) / len(names)
	result := map[string]interface{}{"client": "go-nsq (youzan)", "version": nsq.VERSION}
	count := &counter{target: -1, done: make(chan struct{})}
	quiet := log.New(io.Discard, "", 0)

	rss0, heap0 := rss(), inUse()
	cluster0 := procCPU(*clusterPID)
	t0, cpu0 := time.Now(), cpuSeconds()
	consumers := make([]*nsq.Consumer, 0, len(names))
	for _, topic := range names {
		config := nsq.NewConfig()
		config.MaxInFlight = budget
		config.HeartbeatInterval = time.Duration(*heartbeat * float64(time.Second))
		consumer, err := nsq.NewConsumer(topic, *channel, config)
		if err != nil {
			log.Fatal(err)
		}
		consumer.SetLogger(quiet, nsq.LogLevelError)
		consumer.AddHandler(count)
		// it looks up the topic and connects to each partition before returning
		if err := consumer.ConnectToNSQLookupd(*lookupd); err != nil {
			log.Fatal(err)
		}
		consumers = append(consumers, consumer)
	}
	connected := func() int {
		total := 0
		for _, c := range consumers {
			total += c.Stats().Connections
		}
		return total
	}
	for connected() < *expected {
		if time.Since(t0).Seconds() > *timeout {
			log.Fatalf("only %d subscribed", connected())
		}
		time.Sleep(time.Millisecond)
	}
	result["subscribe_s"] = time.Since(t0).Seconds()
	result["subscribe_cpu_s"] = cpuSeconds() - cpu0
	if *clusterPID != 0 {
		result["subscribe_cluster_cpu_s"] = procCPU(*clusterPID) - cluster0
	}
	result["connections"] = connected()
	time.Sleep(time.Duration(*settle * float64(time.Second)))
	rss1, heap1 := rss(), inUse()
	n := float64(connected())
	result["rss_per_connection"] = float64(rss1-rss0) / n
	result["rss_before"], result["rss_after"] = rss0, rss1
	result["traced_per_connection"] = float64(heap1-heap0) / n

	if *idle > 0 {
		t0, cpu0 = time.Now(), cpuSeconds()
		time.Sleep(time.Duration(*idle * float64(time.Second)))
		seconds := time.Since(t0).Seconds()
		result["idle_s"] = seconds
		result["idle_cpu"] = (cpuSeconds() - cpu0) / seconds
	}
	if *messages > 0 {
		for _, c := range consumers {
			c.ChangeMaxInFlight(0)
		}
		time.Sleep(100 * time.Millisecond) // the RDY 0s on their way before anything is published
		fmt.Println("paused")
		line, _ := bufio.NewReader(os.Stdin).ReadString('\n')
		if strings.TrimSpace(line) != "go" {
			log.Fatal("expected go")
		}
		before := atomic.LoadInt64(&count.received)
		atomic.StoreInt64(&count.target, before+*messages)
		t0, cpu0 = time.Now(), cpuSeconds()
		for _, c := range consumers {
			c.ChangeMaxInFlight(budget)
		}
		select {
		case <-count.done:
		case <-time.After(time.Duration(*timeout * float64(time.Second))):
			log.Fatalf("received %d of %d", atomic.LoadInt64(&count.received), before+*messages)
		}
		result["traffic_s"] = time.Since(t0).Seconds()
		result["traffic_cpu_s"] = cpuSeconds() - cpu0
		result["messages"] = *messages - before
	}
	for _, c := range consumers {
		c.Stop()
	}
	for _, c := range consumers {
		<-c.StopChan
	}
	out, _ := json.Marshal(result)
	fmt.Println(string(out))
}
