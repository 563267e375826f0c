// go-nsq benchmark worker: one workload against the emulated cluster, one JSON result line
// (see bench/clients/_worker.py). Used the way go-nsq's documentation shows: a Producer's
// Publish and MultiPublish (synchronous: each returns once nsqd answered), called from one
// goroutine (pub1), from --concurrency goroutines (pub100) or --mpub-window (mpub100); a
// Consumer with a HandlerFunc whose nil return FINs the message (consume).
package main

import (
	"io/ioutil"
	"log"
	"time"

	"github.com/nsqio/go-nsq"

	"smartnsqbench/common"
)

var quiet = log.New(ioutil.Discard, "", 0)

func publish(args *common.Args, r *common.Result) {
	if len(args.Nsqd) == 0 {
		common.Fail("go-nsq publish: --nsqd only")
	}
	producer, err := nsq.NewProducer(args.Nsqd[0], nsq.NewConfig())
	if err != nil {
		common.Fail("producer: %v", err)
	}
	producer.SetLogger(quiet, nsq.LogLevelError)
	defer producer.Stop()
	batch := common.Batch(args)
	pub := func() error { return producer.Publish(args.Topic, common.Body) }
	mpub := func() error { return producer.MultiPublish(args.Topic, batch) }
	common.Publish(args, r, pub, mpub)
}

func consume(args *common.Args, r *common.Result) {
	config := nsq.NewConfig()
	config.MaxInFlight = args.MaxInFlight
	done := make(chan struct{})
	received := 0
	m := common.NewMeter(args.ClusterPid)
	m.Start()
	consumer, err := nsq.NewConsumer(args.Topic, args.Channel, config)
	if err != nil {
		common.Fail("consumer: %v", err)
	}
	consumer.SetLogger(quiet, nsq.LogLevelError)
	consumer.AddHandler(nsq.HandlerFunc(func(message *nsq.Message) error {
		received++ // one handler goroutine: AddHandler's default
		if received == args.Messages {
			close(done)
		}
		return nil
	}))
	if len(args.Lookupd) > 0 {
		err = consumer.ConnectToNSQLookupds(args.Lookupd)
	} else {
		err = consumer.ConnectToNSQDs(args.Nsqd)
	}
	if err != nil {
		common.Fail("connect: %v", err)
	}
	<-done
	m.Stop()
	consumer.Stop()
	select {
	case <-consumer.StopChan:
	case <-time.After(5 * time.Second):
	}
	m.Fill(r, args.Messages)
	r.Extra["finished"] = received
}

func main() {
	args := common.Parse("go-nsq", []string{"consume", "pub1", "pub100", "mpub100"})
	common.Deadline(args)
	r := &common.Result{Client: "go-nsq", Version: nsq.VERSION, Workload: args.Workload}
	r.Extra = map[string]interface{}{}
	if args.Workload == "consume" {
		consume(args, r)
	} else {
		publish(args, r)
	}
	common.Emit(r)
}
