"""Avro records through Confluent's own Python serializers, for the
integration tests (integration/validate_schema_clients_test.go runs it with
the venv python that scripts/clients installs): confluent_kafka's
SchemaRegistryClient with AvroSerializer and AvroDeserializer (fastavro)
against the registry at --registry (FERRY_SCHEMA_REGISTRY_URL).

Records travel as JSON lines. A value is the Avro record as a JSON object;
the fields named by --bytes-field hold Avro bytes, base64 in the JSON:

    {"key": "<b64>"|null, "value": {...}}     serialized by AvroSerializer
    {"key": "<b64>"|null, "raw": "<b64>"}     sent as these bytes, unserialized

Subcommands (every one takes --bootstrap, --registry, repeated -X
name=value producer/consumer properties and --bytes-field NAME):

  produce TOPIC --schema FILE [--subject S] [--no-auto-register]
        records from stdin, one produce and flush each; prints one line per
        record, {"index", "partition", "offset"} when the broker took it or
        {"index", "error", "code", "sent"} when it was refused, sent being
        the bytes the serializer made (base64; exit 0 either way).
        --subject names the subject for every record instead of
        TopicNameStrategy's TOPIC-value; --no-auto-register looks the schema
        up under the subject (auto.register.schemas=false) instead of
        registering it.
  consume TOPIC
        assigns partition 0 from the beginning and prints each record up to
        the end, deserialized: {"partition", "offset", "key", "value"} or
        {"partition", "offset", "error"} when AvroDeserializer refuses it.

Errors other than a record's go to stderr; a failed step exits 1.
"""

import argparse
import base64
import json
import sys
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext


# The JSON-line helpers are kclient.py's (same folder, on sys.path when this
# script runs).
from kclient import b64, config, emit, unb64  # noqa: E402


def fail(msg):
    sys.stderr.write("avroclient: %s\n" % msg)
    sys.exit(1)


def from_json(args, value):
    """The Avro record of a JSON value: --bytes-field members base64-decoded."""
    value = dict(value)
    for f in args.bytes_field:
        if f in value:
            value[f] = unb64(value[f])
    return value


def to_json(args, value):
    value = dict(value)
    for f in args.bytes_field:
        if f in value:
            value[f] = b64(value[f])
    return value


def cmd_produce(args):
    with open(args.schema) as f:
        schema = f.read()
    conf = {"auto.register.schemas": not args.no_auto_register}
    if args.subject:
        conf["subject.name.strategy"] = lambda ctx, record_name: args.subject
    ser = AvroSerializer(SchemaRegistryClient({"url": args.registry}), schema, conf=conf)
    p = Producer(config(args))
    for i, line in enumerate(l for l in sys.stdin if l.strip()):
        r = json.loads(line)
        if "raw" in r:
            value = unb64(r["raw"])
        else:
            value = ser(from_json(args, r["value"]), SerializationContext(args.topic, MessageField.VALUE))
        outcome = {}

        def delivered(err, m, outcome=outcome, value=value):
            if err is not None:
                outcome.update(error=err.str(), code=err.name(), sent=b64(value))
            else:
                outcome.update(partition=m.partition(), offset=m.offset())

        p.produce(args.topic, key=unb64(r.get("key")), value=value, on_delivery=delivered)
        if p.flush(args.timeout):
            fail("record %d not delivered within %ss" % (i, args.timeout))
        emit(dict(outcome, index=i))


def cmd_consume(args):
    de = AvroDeserializer(SchemaRegistryClient({"url": args.registry}))
    c = Consumer(config(args, **{"group.id": "avroclient-unused", "enable.auto.commit": False,
                                 "enable.partition.eof": True}))
    c.assign([TopicPartition(args.topic, 0, OFFSET_BEGINNING)])
    deadline = time.monotonic() + args.timeout
    while True:
        if time.monotonic() > deadline:
            fail("no end of partition 0 within %ss" % args.timeout)
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            if m.error().code() == KafkaError._PARTITION_EOF:
                break
            fail("consume: %s" % m.error())
        out = {"partition": m.partition(), "offset": m.offset(), "key": b64(m.key())}
        try:
            out["value"] = to_json(args, de(m.value(), SerializationContext(args.topic, MessageField.VALUE)))
        except Exception as e:  # the deserializer's verdict on this record
            out["error"] = "%s: %s" % (type(e).__name__, e)
        emit(out)
    c.close()


def main():
    ap = argparse.ArgumentParser(prog="avroclient")
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--registry", required=True, help="the Confluent-compatible registry URL")
    ap.add_argument("-X", action="append", default=[], help="client property name=value")
    ap.add_argument("--bytes-field", action="append", default=[], help="a field of Avro type bytes (base64 in JSON)")
    ap.add_argument("--timeout", type=float, default=120, help="seconds")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("produce")
    p.add_argument("topic")
    p.add_argument("--schema", required=True, help="file holding the Avro schema")
    p.add_argument("--subject")
    p.add_argument("--no-auto-register", action="store_true")
    sub.add_parser("consume").add_argument("topic")
    args = ap.parse_args()
    try:
        {"produce": cmd_produce, "consume": cmd_consume}[args.cmd](args)
    except KafkaException as e:
        fail("%s: %s" % (args.cmd, e))


if __name__ == "__main__":
    main()
