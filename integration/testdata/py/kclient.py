"""A small command-line driver of the Python confluent-kafka client for the
integration tests (integration/clients_test.go runs it with the venv python
that scripts/clients installs).

Records travel as JSON lines; keys, values and header values are base64 so
any bytes survive:

    {"key": "<b64>"|null, "value": "<b64>"|null, "headers": [["name", "<b64>"|null], ...],
     "partition": 0, "offset": 12}

Subcommands (every one takes --bootstrap and repeated -X name=value client
properties):

  produce TOPIC          records from stdin; prints one line per delivery
                         ({"partition", "offset"}); exits 1 on any failure
  txn-produce TOPIC      transactions from stdin, one per line:
                         {"end": "commit"|"abort", "records": [record, ...]}
                         (-X transactional.id=... is required)
  consume TOPIC          assigns every partition from the beginning and prints
                         the records up to the end of each partition
  group-consume TOPIC    joins group --group with --protocol classic|consumer;
                         prints {"event": "assigned"|"revoked", "partitions"}
                         and {"event": "record", ...} lines and commits each
                         record; runs until stdin closes
  create-topics          creates TOPIC:PARTITIONS arguments through the admin API
  metadata               prints the cluster metadata as the client sees it

Errors go to stderr; a failed step exits 1.
"""

import argparse
import base64
import json
import select
import sys
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def b64(b):
    return None if b is None else base64.b64encode(b).decode()


def unb64(s):
    return None if s is None else base64.b64decode(s)


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def fail(msg):
    sys.stderr.write("kclient: %s\n" % msg)
    sys.exit(1)


def config(args, **extra):
    conf = {"bootstrap.servers": args.bootstrap}
    conf.update(extra)
    for kv in args.X:
        k, sep, v = kv.partition("=")
        if not sep:
            fail("bad -X %r: want name=value" % kv)
        conf[k] = v
    return conf


def record_json(m):
    return {
        "partition": m.partition(),
        "offset": m.offset(),
        "key": b64(m.key()),
        "value": b64(m.value()),
        "headers": [[k, b64(v)] for k, v in (m.headers() or [])],
    }


def produce_records(p, topic, records, delivered):
    for r in records:
        headers = [(k, unb64(v)) for k, v in r.get("headers") or []]
        p.produce(topic, key=unb64(r.get("key")), value=unb64(r.get("value")), headers=headers or None,
                  on_delivery=delivered)
        p.poll(0)


def cmd_produce(args):
    p = Producer(config(args))
    errors = []

    def delivered(err, m):
        if err is not None:
            errors.append(str(err))
        else:
            emit({"partition": m.partition(), "offset": m.offset()})

    records = [json.loads(line) for line in sys.stdin if line.strip()]
    produce_records(p, args.topic, records, delivered)
    left = p.flush(args.timeout)
    if left:
        fail("%d records not delivered within %ss" % (left, args.timeout))
    if errors:
        fail("delivery failed: %s" % "; ".join(errors))


def cmd_txn_produce(args):
    conf = config(args)
    if "transactional.id" not in conf:
        fail("txn-produce needs -X transactional.id=...")
    p = Producer(conf)
    p.init_transactions(args.timeout)
    errors = []

    def delivered(err, m):
        if err is not None:
            errors.append(str(err))

    for line in sys.stdin:
        if not line.strip():
            continue
        txn = json.loads(line)
        p.begin_transaction()
        produce_records(p, args.topic, txn["records"], delivered)
        p.flush(args.timeout)
        if errors:
            fail("delivery failed: %s" % "; ".join(errors))
        if txn["end"] == "commit":
            p.commit_transaction(args.timeout)
        elif txn["end"] == "abort":
            p.abort_transaction(args.timeout)
        else:
            fail("bad transaction end %r" % txn["end"])
        emit({"end": txn["end"], "records": len(txn["records"])})


def cmd_consume(args):
    c = Consumer(config(args, **{"group.id": "kclient-unused", "enable.auto.commit": False,
                                 "enable.partition.eof": True}))
    md = c.list_topics(args.topic, timeout=args.timeout)
    t = md.topics.get(args.topic)
    if t is None or t.error is not None:
        fail("topic %s: %s" % (args.topic, None if t is None else t.error))
    parts = sorted(t.partitions)
    c.assign([TopicPartition(args.topic, p, OFFSET_BEGINNING) for p in parts])
    at_eof = set()
    deadline = time.monotonic() + args.timeout
    while len(at_eof) < len(parts):
        if time.monotonic() > deadline:
            fail("no end of partitions %s within %ss" % (sorted(set(parts) - at_eof), args.timeout))
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            if m.error().code() == KafkaError._PARTITION_EOF:
                at_eof.add(m.partition())
                continue
            fail("consume: %s" % m.error())
        at_eof.discard(m.partition())
        emit(record_json(m))
    c.close()


def cmd_group_consume(args):
    conf = config(args, **{"group.id": args.group, "enable.auto.commit": False,
                           "auto.offset.reset": "earliest", "group.protocol": args.protocol})
    if args.protocol == "classic":
        # The cooperative assignor lets the first member keep part of its
        # partitions during the rebalance, as KIP-848 does by design.
        conf.setdefault("partition.assignment.strategy", "cooperative-sticky")
    c = Consumer(conf)

    def on_assign(consumer, parts):
        emit({"event": "assigned", "partitions": sorted(p.partition for p in parts)})

    def on_revoke(consumer, parts):
        emit({"event": "revoked", "partitions": sorted(p.partition for p in parts)})

    c.subscribe([args.topic], on_assign=on_assign, on_revoke=on_revoke)
    while True:
        m = c.poll(0.2)
        if m is not None:
            if m.error():
                fail("consume: %s" % m.error())
            c.commit(message=m, asynchronous=False)
            emit(dict(record_json(m), event="record"))
        r, _, _ = select.select([sys.stdin], [], [], 0)
        if r and not sys.stdin.readline():
            break  # stdin closed: leave the group
    c.close()
    emit({"event": "closed"})


def cmd_create_topics(args):
    a = AdminClient(config(args))
    topics = []
    for spec in args.topics:
        name, _, n = spec.rpartition(":")
        topics.append(NewTopic(name, num_partitions=int(n), replication_factor=1))
    for name, f in a.create_topics(topics, operation_timeout=args.timeout, request_timeout=args.timeout).items():
        try:
            f.result()
        except KafkaException as e:
            fail("create topic %s: %s" % (name, e))
        emit({"created": name})


def cmd_metadata(args):
    a = AdminClient(config(args))
    md = a.list_topics(timeout=args.timeout)
    emit({
        "cluster_id": md.cluster_id,
        "controller_id": md.controller_id,
        "brokers": [{"id": b.id, "host": b.host, "port": b.port} for b in md.brokers.values()],
        "topics": sorted(md.topics),
    })


def main():
    ap = argparse.ArgumentParser(prog="kclient")
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("-X", action="append", default=[], help="client property name=value")
    ap.add_argument("--timeout", type=float, default=60, help="seconds")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("produce", "txn-produce", "consume"):
        sub.add_parser(name).add_argument("topic")
    g = sub.add_parser("group-consume")
    g.add_argument("topic")
    g.add_argument("--group", required=True)
    g.add_argument("--protocol", choices=["classic", "consumer"], default="classic")
    sub.add_parser("create-topics").add_argument("topics", nargs="+", help="NAME:PARTITIONS")
    sub.add_parser("metadata")
    args = ap.parse_args()
    try:
        {
            "produce": cmd_produce,
            "txn-produce": cmd_txn_produce,
            "consume": cmd_consume,
            "group-consume": cmd_group_consume,
            "create-topics": cmd_create_topics,
            "metadata": cmd_metadata,
        }[args.cmd](args)
    except KafkaException as e:
        fail("%s: %s" % (args.cmd, e))


if __name__ == "__main__":
    main()
