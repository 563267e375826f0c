// youzan go-nsq benchmark worker: one workload against the emulated youzan cluster, one
// JSON result line (see bench/clients/_worker.py). Used the way its documentation shows: a
// TopicProducerMgr found through nsqlookupd, whose Publish and MultiPublish are synchronous
// (pub1 from one goroutine, pub100 from --concurrency, mpub100 from --mpub-window); a
// Consumer found through nsqlookupd (--ordered: EnableOrdered, SUB_ORDERED on every
// partition) with a HandlerFunc whose nil return FINs the message.
package main

import (
	"io/ioutil"
	"log"
	"time"

	"github.com/youzan/go-nsq"

	"smartnsqbench/common"
)

var quiet = log.New(ioutil.Discard, "", 0)

func lookupd(args *common.Args) string {
	if len(args.Lookupd) == 0 {
		common.Fail("youzan go-nsq: --lookupd only")
	}
	return args.Lookupd[0]
}

func publish(args *common.Args, r *common.Result) {
	config := nsq.NewConfig()
	producer, err := nsq.NewTopicProducerMgr([]string{args.Topic}, config)
	if err != nil {
		common.Fail("producer: %v", err)
	}
	producer.SetLogger(quiet, nsq.LogLevelError)
	if err := producer.ConnectToNSQLookupd(lookupd(args)); err != nil {
		common.Fail("lookupd: %v", err)
	}
	defer producer.Stop()
	batch := common.Batch(args)
	pub := func() error { return producer.Publish(args.Topic, common.Body) }
	mpub := func() error { return producer.MultiPublish(args.Topic, batch) }
	common.Publish(args, r, pub, mpub)
}

func consume(args *common.Args, r *common.Result) {
	config := nsq.NewConfig()
	config.MaxInFlight = args.MaxInFlight
	config.EnableOrdered = args.Ordered
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
	if err := consumer.ConnectToNSQLookupd(lookupd(args)); err != nil {
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
	r.Extra["ordered"] = args.Ordered
}

func main() {
	args := common.Parse("youzan-go-nsq", []string{"consume", "pub1", "pub100", "mpub100"})
	common.Deadline(args)
	r := &common.Result{Client: "youzan-go-nsq", Version: nsq.VERSION, Workload: args.Workload}
	r.Extra = map[string]interface{}{}
	if args.Workload == "consume" {
		consume(args, r)
	} else {
		publish(args, r)
	}
	common.Emit(r)
}
